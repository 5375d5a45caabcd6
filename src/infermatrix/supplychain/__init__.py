"""The supply chain of a published image: `sign` (cosign signatures on the digest), `attest`
(the in-toto statements: provenance, the test result bound to the image that ran) and `sbom`
(the image's packages, pinned). The publish step and the consumer's pull call them; they read
the journal's records and the tag policy (model.tagpolicy), never a step."""
