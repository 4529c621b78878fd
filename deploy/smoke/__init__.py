"""Run the production stack without Docker: the image's install, compose's services as processes."""
