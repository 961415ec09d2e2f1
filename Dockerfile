# syntax=docker/dockerfile:1
# baton: one image for the controller (`baton controller`), the worker pods (`baton worker`) and
# the executor the worker pods' init container copies into the tools container (`baton-exec`,
# linked statically so it runs in any image the run names as its tools image).
#
#   docker build -t baton:dev .                     # the default: compiles baton in the build stage
#
# The project's tests build the same runtime from binaries compiled on the host (no rust image
# can be had without a registry): hack/images.sh runs
#   podman build --pull=never --target prebuilt .   # copies target/image/{baton,kubectl-baton,baton-exec}
# Both stages below `runtime-base` are identical but for where the two binaries come from.

# --- build ---------------------------------------------------------------------------------
FROM rust:1.89-bookworm AS build
WORKDIR /src
# benches/ and examples/ only because Cargo.toml names targets there, testkit/ because it is a
# member of the workspace (cargo checks they exist).
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY exec ./exec
COPY testkit ./testkit
COPY benches ./benches
COPY examples ./examples
# Cache mounts keep the registry and the target dir between builds. The executor is built for
# the host's triple named explicitly, so crt-static applies to it and not to build scripts.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin baton --bin kubectl-baton \
 && triple=$(rustc -vV | sed -n 's/^host: //p') \
 && RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked -p baton-exec --target "$triple" \
 && install -D -m 0755 target/release/baton /out/baton \
 && install -D -m 0755 target/release/kubectl-baton /out/kubectl-baton \
 && install -D -m 0755 "target/$triple/release/baton-exec" /out/baton-exec

# --- runtime base --------------------------------------------------------------------------
# Debian slim rather than distroless: the worker's `shell` tool runs `sh -c`, and probes too.
FROM debian:bookworm-slim AS runtime-base
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin nonroot
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 65532:65532
ENTRYPOINT ["baton"]
CMD ["--help"]

# --- prebuilt: the runtime with binaries built on the host (what the project's CI builds) --
FROM runtime-base AS prebuilt
COPY target/image/baton target/image/kubectl-baton target/image/baton-exec /usr/local/bin/

# --- runtime (the default target) ----------------------------------------------------------
FROM runtime-base AS runtime
COPY --from=build /out/baton /out/kubectl-baton /out/baton-exec /usr/local/bin/
