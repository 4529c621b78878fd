"""cft's Python SDK: log inference calls and feedback to a cft API server in the background.

Needs only httpx. `Client` batches and retries; `cft_sdk.openai.wrap` makes an OpenAI client
log its chat completions. See docs/sdk.md.
"""

from cft_sdk.client import Client, Stats
from cft_sdk.ids import new_request_id, span_request_id

__version__ = "0.1.0"
__all__ = ["Client", "Stats", "new_request_id", "span_request_id"]
