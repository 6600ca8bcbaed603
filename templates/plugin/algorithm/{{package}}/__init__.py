"""{{name}}: an rlinf plugin."""
