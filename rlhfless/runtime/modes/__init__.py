"""The modes: every decision that differs between serverless and serverful (`policy`: `ModePolicy`, its two
implementations and the registry a platform preset adds to). A mode decides; the driver carries it out."""
