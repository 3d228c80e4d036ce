package sim

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"sort"
	"strconv"
	"unicode/utf8"
)

// Layout of the picture, in pixels.
const (
	svgWidth    = 1200.0
	svgLeft     = 90.0 // room for row names
	svgRight    = 20.0
	svgTop      = 40.0 // below the title
	svgRowH     = 26.0
	svgRowGap   = 6.0
	svgCharW    = 6.2 // rough width of one character at font-size 10, to decide if a label fits
	svgLegendH  = 18.0
	svgMinWidth = 0.5 // so that very short ops stay visible
)

// kindColors are the colours of the kinds the offloading pipeline uses, in legend order.
// Other kinds get a colour from fallbackColors picked by a hash of the name, so a kind keeps
// its colour from picture to picture.
var kindColors = []struct{ kind, color string }{
	{"attention", "#4e79a7"},
	{"router", "#f28e2b"},
	{"predictor", "#ff9da7"},
	{"expert", "#59a14f"},
	{"copy", "#b07aa1"},
	{KindStall, "#e15759"},
	{"cpu", "#edc948"},
	{KindWait, "#bab0ac"},
}

var fallbackColors = []string{"#76b7b2", "#9c755f", "#86bcb6", "#d37295", "#a0cbe8", "#8cd17d", "#f1ce63", "#79706e"}

func kindColor(kind string) string {
	for _, kc := range kindColors {
		if kc.kind == kind {
			return kc.color
		}
	}
	h := fnv.New32a()
	h.Write([]byte(kind))
	return fallbackColors[h.Sum32()%uint32(len(fallbackColors))]
}

// Extent returns the earliest start and the latest end of spans, the window that shows them
// all; 0, 0 when there are none.
func Extent(spans []Span) (from, to float64) {
	for i, s := range spans {
		if i == 0 || s.Start < from {
			from = s.Start
		}
		if i == 0 || s.End > to {
			to = s.End
		}
	}
	return from, to
}

// WriteSVG draws the spans that overlap [from, to] (seconds) as a timeline: one row per
// stream in order of first appearance, rectangles coloured by kind with their labels where
// they fit, a time axis in µs, ms or s, and a legend of the kinds shown. Every rectangle has
// a tooltip with its exact times.
func WriteSVG(w io.Writer, spans []Span, from, to float64, title string) error {
	if math.IsNaN(from) || math.IsNaN(to) || math.IsInf(from, 0) || math.IsInf(to, 0) || !(to > from) {
		return fmt.Errorf("timeline SVG %q: bad time window [%v, %v]: need finite from < to", title, from, to)
	}
	pl := newSVGPlot(spans, from, to)
	var body bytes.Buffer
	pl.drawRows(&body)
	shown := pl.drawSpans(&body, spans)
	axisY := pl.rowY(len(pl.rows)) + 2
	pl.drawAxis(&body, axisY)
	height := drawLegend(&body, legendKinds(shown), axisY+34) + 14

	// The header comes last because the height is known only once the legend is laid out.
	var b bytes.Buffer
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n")
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" viewBox="0 0 %s %s" font-family="sans-serif">`+"\n",
		num(svgWidth), num(height), num(svgWidth), num(height))
	fmt.Fprintf(&b, "<title>%s</title>\n", esc(title))
	fmt.Fprintf(&b, `<rect x="0" y="0" width="%s" height="%s" fill="#ffffff"/>`+"\n", num(svgWidth), num(height))
	fmt.Fprintf(&b, `<text x="%s" y="22" font-size="14" font-weight="bold">%s</text>`+"\n", num(svgLeft), esc(title))
	b.Write(body.Bytes())
	b.WriteString("</svg>\n")
	if _, err := w.Write(b.Bytes()); err != nil {
		return fmt.Errorf("write timeline SVG %q: %w", title, err)
	}
	return nil
}

// svgPlot maps a window of time and the streams onto the picture: x from seconds, y from a
// stream's row.
type svgPlot struct {
	from, to, plotW float64
	rows            []string       // streams in order of first appearance
	rowOf           map[string]int // stream to row
}

func newSVGPlot(spans []Span, from, to float64) *svgPlot {
	pl := &svgPlot{from: from, to: to, plotW: svgWidth - svgLeft - svgRight, rowOf: map[string]int{}}
	for _, s := range spans {
		if _, ok := pl.rowOf[s.Stream]; !ok {
			pl.rowOf[s.Stream] = len(pl.rows)
			pl.rows = append(pl.rows, s.Stream)
		}
	}
	return pl
}

func (pl *svgPlot) x(t float64) float64 { return svgLeft + (t-pl.from)/(pl.to-pl.from)*pl.plotW }
func (pl *svgPlot) rowY(i int) float64  { return svgTop + float64(i)*(svgRowH+svgRowGap) }

// drawRows draws each stream's background band and name.
func (pl *svgPlot) drawRows(body *bytes.Buffer) {
	for i, name := range pl.rows {
		y := pl.rowY(i)
		fmt.Fprintf(body, `<rect class="row" x="%s" y="%s" width="%s" height="%s" fill="#f4f4f4"/>`+"\n",
			num(svgLeft), num(y), num(pl.plotW), num(svgRowH))
		fmt.Fprintf(body, `<text x="%s" y="%s" text-anchor="end" font-size="12">%s</text>`+"\n",
			num(svgLeft-6), num(y+svgRowH/2+4), esc(name))
	}
}

// drawSpans draws the spans in the window, clipped to it, and returns the kinds it drew for
// the legend.
func (pl *svgPlot) drawSpans(body *bytes.Buffer, spans []Span) map[string]bool {
	shown := map[string]bool{}
	for _, s := range spans {
		if !inWindow(s, pl.from, pl.to) {
			continue
		}
		shown[s.Kind] = true
		x0, x1 := pl.x(max(s.Start, pl.from)), pl.x(min(s.End, pl.to))
		wd := max(x1-x0, svgMinWidth)
		y := pl.rowY(pl.rowOf[s.Stream])
		tip := fmt.Sprintf("%s [%s] %s: %s – %s (%s)", s.Stream, s.Kind, s.Label,
			fmtTime(s.Start), fmtTime(s.End), fmtTime(s.Duration()))
		fmt.Fprintf(body, `<rect class="span" x="%s" y="%s" width="%s" height="%s" fill="%s" stroke="#ffffff" stroke-width="0.5"><title>%s</title></rect>`+"\n",
			num(x0), num(y+2), num(wd), num(svgRowH-4), kindColor(s.Kind), esc(tip))
		if s.Label != "" && float64(utf8.RuneCountInString(s.Label))*svgCharW+4 <= wd {
			fmt.Fprintf(body, `<text class="label" x="%s" y="%s" text-anchor="middle" font-size="10">%s</text>`+"\n",
				num(x0+wd/2), num(y+svgRowH/2+3.5), esc(s.Label))
		}
	}
	return shown
}

// drawAxis draws the time axis at axisY with ticks at a round step, about eight of them.
func (pl *svgPlot) drawAxis(body *bytes.Buffer, axisY float64) {
	from, to := pl.from, pl.to
	fmt.Fprintf(body, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#333333"/>`+"\n",
		num(svgLeft), num(axisY), num(svgLeft+pl.plotW), num(axisY))
	scale, unit := timeUnit(to - from)
	step := niceStep((to - from) * scale / 8)
	decimals := max(0, -int(math.Floor(math.Log10(step))))
	first := math.Ceil(from*scale/step) * step
	// The cap guards against a window so narrow next to its offset that adding a step no
	// longer changes a float64.
	for i := 0; i < 1000; i++ {
		v := first + float64(i)*step
		if v > to*scale*(1+1e-12) {
			break
		}
		tx := pl.x(v / scale)
		fmt.Fprintf(body, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#333333"/>`+"\n",
			num(tx), num(axisY), num(tx), num(axisY+5))
		fmt.Fprintf(body, `<text x="%s" y="%s" text-anchor="middle" font-size="10">%s</text>`+"\n",
			num(tx), num(axisY+17), esc(strconv.FormatFloat(v, 'f', decimals, 64)+" "+unit))
	}
}

// legendKinds orders the kinds shown for the legend: the known kinds in their fixed order,
// then the others sorted, so that a legend reads the same from picture to picture.
func legendKinds(shown map[string]bool) []string {
	var kinds []string
	for _, kc := range kindColors {
		if shown[kc.kind] {
			kinds = append(kinds, kc.kind)
			delete(shown, kc.kind)
		}
	}
	var others []string
	for k := range shown {
		others = append(others, k)
	}
	sort.Strings(others)
	return append(kinds, others...)
}

// drawLegend draws the kinds from baseline ly down, wrapping at the picture's width, and
// returns the baseline of its last line.
func drawLegend(body *bytes.Buffer, kinds []string, ly float64) float64 {
	lx := svgLeft
	for _, k := range kinds {
		itemW := 24 + float64(utf8.RuneCountInString(k))*svgCharW + 16
		if lx+itemW > svgWidth-svgRight && lx > svgLeft {
			lx, ly = svgLeft, ly+svgLegendH
		}
		fmt.Fprintf(body, `<rect class="legend" x="%s" y="%s" width="12" height="12" fill="%s"/>`+"\n",
			num(lx), num(ly-10), kindColor(k))
		fmt.Fprintf(body, `<text x="%s" y="%s" font-size="11">%s</text>`+"\n", num(lx+18), num(ly), esc(k))
		lx += itemW
	}
	return ly
}

// inWindow reports whether s overlaps [from, to]; an instant span counts when it lies inside.
func inWindow(s Span, from, to float64) bool {
	if s.End == s.Start {
		return s.Start >= from && s.Start <= to
	}
	return s.Start < to && s.End > from
}

// timeUnit picks the unit of the axis for a window of width d seconds.
func timeUnit(d float64) (scale float64, unit string) {
	switch {
	case d < 2e-3:
		return 1e6, "µs"
	case d < 2:
		return 1e3, "ms"
	default:
		return 1, "s"
	}
}

// niceStep rounds raw up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw*(1-1e-9) {
			return m * p
		}
	}
	return 10 * p
}

// fmtTime prints seconds in the unit that suits their size.
func fmtTime(t float64) string {
	scale, unit := timeUnit(math.Abs(t))
	return strconv.FormatFloat(t*scale, 'g', 6, 64) + " " + unit
}

func num(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }

// esc escapes text for XML character data and attribute values.
func esc(s string) string {
	var b bytes.Buffer
	_ = xml.EscapeText(&b, []byte(s)) // fails only when the writer does; bytes.Buffer does not
	return b.String()
}
