module github.com/commit-run/commit-run/internal/asmgen

go 1.26.8

require github.com/mmcloughlin/avo v0.6.0

require (
	golang.org/x/mod v0.29.0 // indirect
	golang.org/x/sync v0.17.0 // indirect
	golang.org/x/tools v0.38.0 // indirect
)
