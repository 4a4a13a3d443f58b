"""The jupyter_server extension: kernel managers, provisioner, websocket, lifecycle and REST."""
