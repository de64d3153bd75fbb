"""rentune's runtime: the CLI, the phase runner, the store and the phases. Imports `jobspec`, never the reverse.

bitsandbytes, where installed (the images have it for QLoRA), would be imported by every `import peft`:
seconds of start-up on CPU and a kernel lookup on a hub. It is hidden from rentune's processes until a
QLoRA job loads its quantized base (entrypoint/training/quantize.py: bitsandbytes_version).
"""

import sys

__version__ = "0.1.0"

sys.modules.setdefault("bitsandbytes", None)  # `import bitsandbytes` raises ImportError; find_spec says None
