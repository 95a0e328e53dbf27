"""The load generator: the runner that replays requests on one absolute timeline, its stamped HTTP client,
and where the load is sent from (this process, worker processes, Ray actors), with the clock offsets and the
client capacity that say whether the client kept up."""
