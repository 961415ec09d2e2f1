# syntax=docker/dockerfile:1
# baton: one image for the controller (`baton controller`) and the worker pods (`baton worker`).
#
# Not built in this project's CI (its machines have no container engine); see the README.
#
#   docker build -t baton:dev .

# --- build ---------------------------------------------------------------------------------
FROM rust:1.89-bookworm AS build
WORKDIR /src
# benches/ and examples/ only because Cargo.toml names targets there (cargo checks they exist).
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
COPY examples ./examples
# Cache mounts keep the registry and the target dir between builds.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin baton --bin kubectl-baton \
 && install -D -m 0755 target/release/baton /out/baton \
 && install -D -m 0755 target/release/kubectl-baton /out/kubectl-baton

# --- runtime -------------------------------------------------------------------------------
# Debian slim rather than distroless: the worker's `shell` tool runs `sh -c`, and probes too.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin nonroot
COPY --from=build /out/baton /out/kubectl-baton /usr/local/bin/
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 65532:65532
ENTRYPOINT ["baton"]
CMD ["--help"]
