"""gymnasium environments as an rlinf simulator. Importing this package does not import gymnasium."""
