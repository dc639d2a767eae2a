"""The Hugging Face Space's entry point: the demo of continuous speculative decoding (the package
:mod:`demo`: one module per tab), served on the embedded models.

    python app.py [--host 127.0.0.1] [--port 7860] [--checkpoints DIR] [--hub-repo REPO] [--help for the limits]
"""

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from demo.gpu import import_spaces

import_spaces()  # first: on ZeroGPU the spaces package must patch torch before anything asks about CUDA

from demo.server import main  # noqa: E402

if __name__ == "__main__":
    main()
