"""What a run is asked to do: the scenario file's model and every request drawn from it before load starts
(arrivals, workload kinds, prompts, traces, sampling), with the `tune:`, `plan:` and `telemetry:` blocks and the
GPU table. Imports no other wing but results."""
