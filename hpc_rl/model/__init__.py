"""Policy networks: one family for every environment spec (entity encoders, LSTM core, decoupled masked heads).

``config`` (``ModelConfig``) imports no torch, so a run's configuration composes without the training stack;
``policy`` holds the network and ``act``, ``device`` the placement, ``tree`` the state conversions for storage,
``surgery`` the changes of a trained policy's shape that keep what it computes.
"""
