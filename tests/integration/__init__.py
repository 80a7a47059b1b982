"""Integration tests: whole commands and real peers (subprocesses, real servers, Ray, S3, speculators, a browser)."""
