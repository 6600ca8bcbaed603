"""rlinf-model-vla: vision-language-action policies for rlinf."""
