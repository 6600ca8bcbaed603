"""Config templates and plugin scaffolds (shipped as package data of rlinf_cli.templates)."""
