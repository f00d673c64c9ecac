# `sam build` (BuildMethod: makefile) runs one target per function,
# build-<LogicalId>, with ARTIFACTS_DIR set. Each target asks cargo-lambda for
# all four binaries at once: the first compiles the workspace a single time
# and links the four in parallel, and the other three find them built (a few
# seconds each). samconfig.toml sets build_in_source, so target/ is shared.
#
# LAMBDA_ARCH picks cargo-lambda's target (the template's functions are arm64).

LAMBDA_ARCH ?= --arm64
FUNCTIONS := provision launch interrupt sweep

.PHONY: lambdas
lambdas:
	cargo lambda build --release --locked $(LAMBDA_ARCH) $(addprefix --package ,$(FUNCTIONS))

# build-ProvisionFunction copies target/lambda/provision/bootstrap, and so on.
build-%Function: lambdas
	cp target/lambda/$(shell echo '$*' | tr '[:upper:]' '[:lower:]')/bootstrap "$(ARTIFACTS_DIR)/bootstrap"
