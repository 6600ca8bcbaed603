"""Meta-World v3 manipulation tasks for rlinf. Importing this package does not import metaworld."""
