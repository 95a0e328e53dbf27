"""The results folder: its files written and read here (folder), their typed models (schema) and the JSON Schema
files generated from them (schema_files). The lowest wing: every other one may read and write results."""
