"""Deployment files (MinIO, Grafana) and the smoke that runs compose's services natively."""
