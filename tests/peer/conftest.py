"""The peer suites are not part of the main ``pytest tests`` run: each has its own ``tests``
package (as upstream) and its own rootdir. ``scripts/peer-tests.sh`` runs them."""
collect_ignore = ["jupyter_client", "jupyter_server"]
