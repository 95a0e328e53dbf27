"""`bench`'s command wiring: parsing, calling the wings, printing, exit codes (app), and `bench probe`'s conformance
table and concurrency sweep (conformance)."""
