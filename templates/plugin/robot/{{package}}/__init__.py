"""{{name}}: an rlinf robot plugin (served with `rlinf env serve` on the robot's computer)."""
