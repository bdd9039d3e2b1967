"""The Docker deployment run for real (issue 24): a Docker engine, a Debian base image made on
the machine, the images built from the project's Dockerfiles, and the scenarios of
docker-compose.yml against vLLM's CPU build. `python -m devtools.deploy` (make test-deploy)."""
