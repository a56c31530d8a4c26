"""The OpenAI-compatible API and the app's front door.

- `routes`: /v1/chat/completions, /v1/models and /metrics, served beside the page through the same slots;
- `request`: a chat-completions body checked and turned into the page's Settings;
- `answer`: an answer cut at its stop strings, and its usage and timings from the rounds;
- `openings`: how many requests may be open at once, in all and per visitor, and sign-in attempts per address;
- `guard`: the middleware every request passes first: Host, Origin, the API key, the body's size.
"""
