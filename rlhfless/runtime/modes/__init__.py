"""The modes: every decision that differs between serverless and serverful (`policy`: `ModePolicy`, its two
implementations and the registry a platform preset adds to). A mode decides, as data (`policy.Keep`, `DecodePick`,
`AfterDecode`, `LearnerSeats`, `ReferencePick`, `Death`); the worker set (`runtime.workerset`) carries it out."""
