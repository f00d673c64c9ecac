# `sam build` (BuildMethod: makefile) runs one target per function,
# build-<LogicalId>, with ARTIFACTS_DIR set. One binary serves all four
# functions (functions/lambda; each function's Handler picks its part), so the
# first target compiles and links the workspace once and the other three find
# it built. samconfig.toml sets build_in_source, so target/ is shared.
#
# LAMBDA_ARCH picks cargo-lambda's target (the template's functions are arm64).

LAMBDA_ARCH ?= --arm64

.PHONY: lambda
lambda:
	cargo lambda build --release --locked $(LAMBDA_ARCH) --package nodesmith-lambda

# Every function's artifact is the same bootstrap.
build-%Function: lambda
	cp target/lambda/nodesmith-lambda/bootstrap "$(ARTIFACTS_DIR)/bootstrap"
