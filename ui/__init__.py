"""The web UI: pure render functions (events -> HTML / plotly figures) and the Gradio wiring in ui.app.

Nothing here imports gradio, torch or transformers at package import time; ui.app imports gradio.
"""
