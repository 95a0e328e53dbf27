"""The engine a run talks to: started, waited for and stopped (session, launcher, start-up), watched while the
load runs (observers, server metrics, telemetry, the step trace), its prefix cache emptied, and `bench probe`'s
conformance checks of what it serves."""
