module github.com/commit-run/commit-run

go 1.26.8
