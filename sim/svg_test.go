package sim

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
)

// svgDoc is what a decoder walk finds in the output.
type svgDoc struct {
	spanRects   int
	rowRects    int
	legendRects int
	texts       []string
	rootName    string
}

// walkSVG parses the whole output with encoding/xml, which fails on anything malformed,
// including unescaped < and & in labels.
func walkSVG(t *testing.T, data []byte) svgDoc {
	t.Helper()
	var doc svgDoc
	dec := xml.NewDecoder(bytes.NewReader(data))
	var inText bool
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("output is not well-formed XML: %v\n%s", err, data)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			if doc.rootName == "" {
				doc.rootName = el.Name.Local
			}
			inText = el.Name.Local == "text" || el.Name.Local == "title"
			if el.Name.Local == "rect" {
				for _, a := range el.Attr {
					if a.Name.Local == "class" {
						switch a.Value {
						case "span":
							doc.spanRects++
						case "row":
							doc.rowRects++
						case "legend":
							doc.legendRects++
						}
					}
				}
			}
		case xml.CharData:
			if inText {
				doc.texts = append(doc.texts, string(el))
			}
		case xml.EndElement:
			inText = false
		}
	}
	return doc
}

func (d svgDoc) hasText(s string) bool {
	for _, t := range d.texts {
		if strings.Contains(t, s) {
			return true
		}
	}
	return false
}

// figureThree is a layer of a CommitMoE decode step: attention and router on the compute
// stream while the predicted experts of the next layer load, then a stall on a late copy.
func figureThree() []Span {
	tl := NewTimeline()
	compute, cp := tl.NewStream("compute"), tl.NewStream("copy")
	compute.Enqueue("attention", "attn 3", 40e-6)
	compute.Enqueue("router", "router 3", 5e-6)
	cp.Enqueue("copy", "L4 e1", 60e-6)
	cp.Enqueue("copy", "L4 e6", 60e-6)
	compute.Enqueue("expert", "L3 e2", 20e-6)
	compute.Enqueue("expert", "L3 e5", 20e-6)
	compute.Wait(cp.Record())
	compute.Enqueue("attention", "attn 4", 40e-6)
	tl.HostWork("cpu", "sample <&> \"x\"", 10e-6)
	return tl.Spans()
}

func TestWriteSVG(t *testing.T) {
	spans := figureThree()
	from, to := Extent(spans)
	if from != 0 || !near(to, 160e-6) {
		t.Fatalf("Extent = %v, %v; want 0, 160e-6", from, to)
	}
	var buf bytes.Buffer
	if err := WriteSVG(&buf, spans, from, to, "layer 3 → 4 <decode & prefetch>"); err != nil {
		t.Fatal(err)
	}
	doc := walkSVG(t, buf.Bytes())
	if doc.rootName != "svg" {
		t.Errorf("root element %q, want svg", doc.rootName)
	}
	if doc.spanRects != len(spans) {
		t.Errorf("%d span rects, want one per span: %d", doc.spanRects, len(spans))
	}
	if doc.rowRects != 3 { // compute, copy, host
		t.Errorf("%d rows, want 3", doc.rowRects)
	}
	// attention, router, expert, copy, stall, cpu
	if doc.legendRects != 6 {
		t.Errorf("%d legend entries, want 6", doc.legendRects)
	}
	for _, want := range []string{"compute", "copy", HostRow, "attn 3", "µs", "layer 3 → 4 <decode & prefetch>", "stall"} {
		if !doc.hasText(want) {
			t.Errorf("no text %q in the picture", want)
		}
	}
	// The label with markup survives a round trip, so it was escaped, and it never appears raw.
	if !doc.hasText(`sample <&> "x"`) {
		t.Error(`label "sample <&> \"x\"" lost in the output`)
	}
	if bytes.Contains(buf.Bytes(), []byte("<&>")) {
		t.Error("raw <&> in the output")
	}
}

func TestWriteSVGWindow(t *testing.T) {
	spans := []Span{
		{Stream: "compute", Kind: "expert", Label: "before", Start: 0, End: 1e-3},
		{Stream: "compute", Kind: "expert", Label: "inside", Start: 2e-3, End: 3e-3},
		{Stream: "copy", Kind: "copy", Label: "straddles", Start: 3.5e-3, End: 6e-3},
		{Stream: "copy", Kind: "copy", Label: "after", Start: 7e-3, End: 8e-3},
		{Stream: "compute", Kind: "marker", Label: "instant", Start: 4e-3, End: 4e-3},
		{Stream: "compute", Kind: "expert", Label: "ends at from", Start: 1e-3, End: 1.5e-3},
	}
	var buf bytes.Buffer
	if err := WriteSVG(&buf, spans, 1.5e-3, 5e-3, "window"); err != nil {
		t.Fatal(err)
	}
	doc := walkSVG(t, buf.Bytes())
	if doc.spanRects != 3 { // inside, straddles, instant
		t.Errorf("%d span rects in [1.5 ms, 5 ms], want 3", doc.spanRects)
	}
	if doc.hasText("before") || doc.hasText("after") {
		t.Error("a span outside the window was drawn")
	}
	if !doc.hasText("ms") {
		t.Error("axis of a 3.5 ms window is not in ms")
	}
	// Both rows stay, even when one has nothing in the window, so zoomed pictures line up.
	if doc.rowRects != 2 {
		t.Errorf("%d rows, want 2", doc.rowRects)
	}
}

func TestWriteSVGBadWindow(t *testing.T) {
	for _, w := range [][2]float64{{1, 1}, {2, 1}, {0, math.Inf(1)}, {math.NaN(), 1}} {
		if err := WriteSVG(io.Discard, nil, w[0], w[1], "t"); err == nil {
			t.Errorf("window %v accepted", w)
		}
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestWriteSVGWriteError(t *testing.T) {
	err := WriteSVG(failWriter{}, figureThree(), 0, 1e-3, "t")
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("error %v, want the writer's error", err)
	}
}

func TestNiceStep(t *testing.T) {
	cases := []struct{ raw, want float64 }{
		{0.9, 1}, {1, 1}, {1.1, 2}, {3, 5}, {7, 10}, {12, 20}, {0.03, 0.05},
	}
	for _, c := range cases {
		if got := niceStep(c.raw); !near(got, c.want) {
			t.Errorf("niceStep(%v) = %v, want %v", c.raw, got, c.want)
		}
	}
}
