"""Load generation spread over a Ray cluster: the driver's side (shards) and the node's (actor)."""
