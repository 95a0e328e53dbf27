"""`bench tune`: each configuration launched once and searched for the highest load that meets the SLOs
(tune), the bracketing search (search) and what is written and printed of it (summary)."""
