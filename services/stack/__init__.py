"""A local stack: the services of deploy/docker-compose.yaml run as local processes the way compose runs them
(`compose_file` reads the file and the Dockerfiles it builds from; `local_stack` starts, checks and stops the
processes). `agl train`, `agl try`, `agl eval`, `make demo` and the end-to-end tests start their services here.

An installed AGL reads the copies of the compose file and the Dockerfiles its wheel carries (setup.py puts them
there at build time); a checkout reads deploy/ itself.
"""
