"""Code shared by the server, the clients and the autoencoder.

Offline by default: nothing downloads models or data at run time. Hugging Face libraries read
``HF_HUB_OFFLINE`` once, when they are first imported, so it is set here, before any module of this
project imports them (an explicit ``HF_HUB_OFFLINE=0`` in the environment is kept).
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
