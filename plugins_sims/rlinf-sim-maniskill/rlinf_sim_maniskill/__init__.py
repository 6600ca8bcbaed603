"""ManiSkill3 tasks for rlinf. Importing this package imports neither mani_skill nor torch."""
