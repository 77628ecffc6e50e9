"""Where workers run: `backend` (local OS processes behind a fork server), `raybackend` (Ray actors, the same
methods) and `pool` (the driver's view of every worker's life and the units budget)."""
