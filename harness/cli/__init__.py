"""`bench`'s command wiring: parsing, calling the wings, exit codes (app); what it prints (console); `bench probe`'s
conformance table and concurrency sweep (conformance)."""
