"""The Hugging Face Space's entry point: the demo of continuous speculative decoding (the package
:mod:`demo`: one module per tab), served on the embedded models.

    python app.py [--host 127.0.0.1] [--port 7860] [--checkpoints DIR] [--hub-repo REPO] [--help for the limits]
"""

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from demo.server import main

if __name__ == "__main__":
    main()
