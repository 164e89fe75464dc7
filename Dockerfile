# syntax=docker/dockerfile:1
# The podmend image: one binary (webhook, audit, Docker guard) on distroless, non-root.
#
#   docker build -t ghcr.io/podmend/podmend:0.1.0 .
#
# The chart's default image (charts/podmend, image.repository) is this one, tagged with the
# crate version (Chart.yaml appVersion).

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# Cache mounts keep the registry and build artefacts between builds (BuildKit). The binary
# links glibc dynamically and nothing else (rustls with ring, no OpenSSL), which the
# distroless "cc" base provides.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin podmend \
    && install -D -m 0755 target/release/podmend /out/podmend \
    && /out/podmend --version

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/podmend /usr/local/bin/podmend
# distroless "nonroot": uid/gid 65532, the user the chart's securityContext runs as.
USER 65532:65532
# 8443: HTTPS webhook (/mutate, /validate); 9090: plain-HTTP /metrics, /healthz, /readyz.
EXPOSE 8443 9090
ENTRYPOINT ["/usr/local/bin/podmend"]
CMD ["serve"]
