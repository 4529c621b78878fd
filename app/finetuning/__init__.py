"""The OpenAI fine-tuning API served by cft: files, jobs, their events and checkpoints."""
