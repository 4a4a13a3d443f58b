# Sourced by the GPU machine's scripts (gpu-run.sh, gpu-room-trace.sh): install_site SITE puts the
# carried wheels (.whl/) into SITE, or keeps SITE as an earlier call on the same machine left it
# (a call carrying .s3/ has no room for .whl/ too), and declares this package's entry points there.
install_site() {
    local site=$1
    if [ -d .whl ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl || return 1
    elif [ ! -d "$site" ]; then
        echo "neither .whl/ nor $site: carry .whl (docs/dev/gpu-tests.md)" >&2; return 1
    fi
    # Entry points of this package without building it (the kernel provisioner is found through them).
    mkdir -p "$site/jupyter_gpucr-0.1.0.dist-info"
    printf 'Metadata-Version: 2.1\nName: jupyter-gpucr\nVersion: 0.1.0\n' > "$site/jupyter_gpucr-0.1.0.dist-info/METADATA"
    printf '[jupyter_client.kernel_provisioners]\ngpucr-provisioner = jupyter_gpucr.server.provisioner:GPUCRProvisioner\n' \
        > "$site/jupyter_gpucr-0.1.0.dist-info/entry_points.txt"
}
