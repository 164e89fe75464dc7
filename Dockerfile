# syntax=docker/dockerfile:1
# The podmend image: one binary (webhook, audit, Docker guard) on distroless, non-root.
#
#   docker build -t ghcr.io/podmend/podmend:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/podmend:TAG --push .
#
# The chart's default image (charts/podmend, image.repository) is this one, tagged with the
# crate version (Chart.yaml appVersion); .github/workflows/release.yml builds and pushes it
# for both platforms on a version tag.
#
# Multi-platform builds cross-compile: the build stage runs on the builder's own platform
# (no emulation) and links for the target platform with Debian's cross toolchain. Only the
# final stage is per platform, and it runs nothing, it copies.

FROM --platform=$BUILDPLATFORM rust:1.95-bookworm AS build
ARG TARGETARCH
WORKDIR /src
# A failing command anywhere in a pipeline fails the step.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The Rust target, C cross compiler (ring and mimalloc build C) and libc for TARGETARCH,
# written to /env for the build step. Debian's cross packages: glibc 2.36, the same as the
# distroless cc-debian12 runtime. Debian replaces them in place with each fix, so their
# versions are not pinned (a pinned one would vanish from the archive): the base image's
# tag pins the release.
# hadolint ignore=DL3008
RUN set -eu; \
    case "$TARGETARCH" in \
      amd64) triple=x86_64-unknown-linux-gnu; gnu=x86_64-linux-gnu ;; \
      arm64) triple=aarch64-unknown-linux-gnu; gnu=aarch64-linux-gnu ;; \
      *) echo "unsupported TARGETARCH '$TARGETARCH': build for linux/amd64 or linux/arm64" >&2; exit 1 ;; \
    esac; \
    linker=cc; \
    if [ "$(dpkg --print-architecture)" != "$TARGETARCH" ]; then \
      apt-get update; \
      apt-get install -y --no-install-recommends "gcc-$(echo "$gnu" | tr _ -)" "libc6-dev-$TARGETARCH-cross"; \
      rm -rf /var/lib/apt/lists/*; \
      rustup target add "$triple"; \
      linker="$gnu-gcc"; \
    fi; \
    upper=$(echo "$triple" | tr '[:lower:]-' '[:upper:]_'); \
    lower=$(echo "$triple" | tr - _); \
    { echo "export TRIPLE=$triple"; \
      echo "export CARGO_TARGET_${upper}_LINKER=$linker"; \
      echo "export CC_${lower}=$linker"; } > /env
COPY . .
# Cache mounts keep the registry and build artefacts between builds (BuildKit); `locked`:
# the amd64 and arm64 builds share them one at a time. The binary links glibc dynamically
# and nothing else (rustls with ring, no OpenSSL), which the distroless "cc" base provides.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    set -eu; . /env; \
    cargo build --release --locked --bin podmend --target "$TRIPLE"; \
    install -D -m 0755 "target/$TRIPLE/release/podmend" /out/podmend; \
    if [ "$(dpkg --print-architecture)" = "$TARGETARCH" ]; then /out/podmend --version; fi

# The bare binary, for release archives: docker buildx build --target binary --output ...
FROM scratch AS binary
COPY --from=build /out/podmend /podmend

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/podmend /usr/local/bin/podmend
# distroless "nonroot": uid/gid 65532, the user the chart's securityContext runs as.
USER 65532:65532
# 8443: HTTPS webhook (/mutate, /validate); 9090: plain-HTTP /metrics, /healthz, /readyz.
EXPOSE 8443 9090
ENTRYPOINT ["/usr/local/bin/podmend"]
CMD ["serve"]
