# Nginx from Debian's package, for the nginx profile where no registry serves nginx:1.27-alpine
# (deploy/docker/docker-compose.cpu.yml). configs/nginx.conf is mounted over /etc/nginx/nginx.conf.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nginx \
    && rm -rf /var/lib/apt/lists/* \
    && ln -sf /dev/stderr /var/log/nginx/error.log
EXPOSE 80
STOPSIGNAL SIGQUIT
CMD ["nginx", "-g", "daemon off;"]
