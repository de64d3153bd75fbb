"""Integration tests: a real moto S3 server in a subprocess on 127.0.0.1, real files, real threads."""
