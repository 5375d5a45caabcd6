"""The consumer's side of a published image: `pull` by digest (with the host check and the
signature), `deploy` (a compose file per GPU or CPU replica, the LXC device lines) and `verify`
(the gpu and model levels on the consumer's own host, and its verdict). They read images.lock,
never the build's state, and sit above the pipeline's stages."""
