"""Tools a language model may call in rlinf's text tasks. Importing this package imports nothing heavy."""
