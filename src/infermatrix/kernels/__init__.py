"""Compiled kernel wheels kept for reuse: the content-keyed cache in the state directory
(kernelcache) and its copy in the registry as OCI artifacts (kernelregistry), so a build on
another machine pulls a wheel instead of compiling it."""
