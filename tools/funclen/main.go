// Command funclen lists the longest hand-written functions of the module: test files and
// generated files (a "Code generated ... DO NOT EDIT." line) aside.
//
//	go run ./tools/funclen [-n 10] [-over 80] [DIR]
//
// It prints each function's lines (from its func line to its closing brace), file:line and
// name, longest first, then how many exceed -over.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

type fn struct {
	lines int
	pos   string
	name  string
}

var generated = regexp.MustCompile(`^// Code generated .* DO NOT EDIT\.$`)

func main() {
	n := flag.Int("n", 10, "functions to list")
	over := flag.Int("over", 80, "count the functions longer than this")
	flag.Parse()
	root := "."
	if flag.NArg() > 0 {
		root = flag.Arg(0)
	}
	var fns []fn
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			// Other modules (internal/asmgen) and dependencies are not this module's code.
			if path != root && (d.Name() == "node_modules" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") || isModule(path)) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || isGenerated(path) {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			start, end := fset.Position(fd.Pos()), fset.Position(fd.End())
			name := fd.Name.Name
			if fd.Recv != nil && len(fd.Recv.List) > 0 {
				name = recvName(fd.Recv.List[0].Type) + "." + name
			}
			fns = append(fns, fn{end.Line - start.Line + 1, fmt.Sprintf("%s:%d", path, start.Line), name})
		}
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "funclen:", err)
		os.Exit(1)
	}
	sort.Slice(fns, func(i, j int) bool { return fns[i].lines > fns[j].lines })
	count := 0
	for i, f := range fns {
		if i < *n {
			fmt.Printf("%4d  %s  %s\n", f.lines, f.pos, f.name)
		}
		if f.lines > *over {
			count++
		}
	}
	fmt.Printf("%d functions over %d lines, of %d\n", count, *over, len(fns))
}

// isModule says whether dir holds a go.mod of its own: another module.
func isModule(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "go.mod"))
	return err == nil
}

// isGenerated says whether the file carries the generated-code marker before its package line.
func isGenerated(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		l := s.Text()
		if generated.MatchString(l) {
			return true
		}
		if strings.HasPrefix(l, "package ") {
			return false
		}
	}
	return false
}

func recvName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recvName(t.X)
	case *ast.IndexExpr:
		return recvName(t.X)
	case *ast.Ident:
		return t.Name
	}
	return "?"
}
