"""Code that runs inside Ray Train workers (torch); nothing here imports the driver or the app.

``api`` is the public worker API and the only reader of the per-process runtime
(``context``); the rest gets its parts passed in.
"""
