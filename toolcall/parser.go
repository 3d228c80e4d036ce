package toolcall

import (
	"strings"
)

// Delta is what a piece of the model's text added to the answer: text, reasoning (harmony's
// analysis channel), and news of calls.
type Delta struct {
	Content, Reasoning string
	Calls              []CallDelta
}

// CallDelta is news of call Index: its ID and Name the first time it is heard of, then
// pieces of its Arguments, which concatenated are the call's arguments (OpenAI's streamed
// tool_calls).
type CallDelta struct {
	Index          int
	ID, Name, Args string
}

// Empty says whether d carries nothing.
func (d Delta) Empty() bool { return d.Content == "" && d.Reasoning == "" && len(d.Calls) == 0 }

// Parser reads one answer of a model as it streams: the text for the user, and the calls,
// given out as soon as they are known (a call's name once whole, its arguments as they
// grow). Text that could be the start of a call's marker is held back until it is told
// apart; whitespace around calls is dropped. Not safe for concurrent use.
type Parser struct {
	f         Format
	buf       string // held back text, or the calls section being read
	inSection bool
	done      int // calls of the sections already read
	sent      []sentCall
	calls     []Call
	content   strings.Builder
	ws        string // whitespace held back: kept if text follows, dropped before a call or the end
	after     bool   // a section just ended: leading whitespace is dropped
	secText   int    // bytes of the open section's content given out
	secReason int    // and of its reasoning
	reasoning strings.Builder
}

type sentCall struct {
	name bool
	args int
}

// NewParser starts reading an answer written in format f.
func NewParser(f Format) *Parser { return &Parser{f: f} }

// Add reads the next text the model wrote.
func (p *Parser) Add(text string) Delta {
	p.buf += text
	var d Delta
	p.read(&d, false)
	return d
}

// Finish ends the answer: what was held back is given out, a call cut short is given as
// far as it went (the generation's finish reason says it was cut), and a section that was
// not one after all is text.
func (p *Parser) Finish() Delta {
	var d Delta
	p.read(&d, true)
	if p.inSection {
		// A section cut short stands for what it gave out; one that gave nothing is text.
		res, err := p.f.section(p.buf, true)
		switch {
		case err == nil && len(res.calls) > 0:
			p.update(&d, res.calls)
		case p.secText > 0 || p.secReason > 0:
			if len(res.content) > p.secText {
				p.text(&d, res.content[p.secText:], false)
			}
			if len(res.reasoning) > p.secReason {
				d.Reasoning += res.reasoning[p.secReason:]
				p.reasoning.WriteString(res.reasoning[p.secReason:])
			}
		default:
			p.text(&d, p.buf, false)
		}
		p.buf, p.inSection, p.secText, p.secReason = "", false, 0, 0
	}
	if !p.inSection && p.buf != "" {
		p.text(&d, p.buf, false)
		p.buf = ""
	}
	p.ws = ""
	return d
}

// Content is the answer's text so far.
func (p *Parser) Content() string { return p.content.String() }

// Reasoning is the answer's reasoning so far.
func (p *Parser) Reasoning() string { return p.reasoning.String() }

// Calls are the calls so far (the last may still be growing).
func (p *Parser) Calls() []Call { return p.calls }

func (p *Parser) read(d *Delta, final bool) {
	for {
		if !p.inSection {
			i, _ := p.firstStart()
			if i < 0 {
				keep := 0
				if !final {
					keep = p.heldBack()
				}
				p.text(d, p.buf[:len(p.buf)-keep], true)
				p.buf = p.buf[len(p.buf)-keep:]
				return
			}
			p.text(d, p.buf[:i], true) // whitespace before a call is the format's: dropped once it is one
			p.buf, p.inSection = p.buf[i:], true
		}
		res, err := p.f.section(p.buf, final)
		if err != nil {
			// Not a calls section after all: its opening marker is text.
			_, m := p.firstStart()
			p.text(d, p.buf[:m], true)
			p.buf, p.inSection, p.secText, p.secReason = p.buf[m:], false, 0, 0
			continue
		}
		p.update(d, res.calls)
		if len(res.content) > p.secText {
			p.text(d, res.content[p.secText:], true)
			p.secText = len(res.content)
		}
		if len(res.reasoning) > p.secReason {
			d.Reasoning += res.reasoning[p.secReason:]
			p.reasoning.WriteString(res.reasoning[p.secReason:])
			p.secReason = len(res.reasoning)
		}
		if res.n == 0 {
			return
		}
		p.ws = ""
		p.done = len(p.sent)
		p.buf, p.inSection, p.after, p.secText, p.secReason = p.buf[res.n:], false, true, 0, 0
	}
}

// firstStart finds the earliest opening marker in the buffer: its index (-1: none) and
// its length.
func (p *Parser) firstStart() (int, int) {
	at, n := -1, 0
	for _, s := range p.f.starts() {
		if i := strings.Index(p.buf, s); i >= 0 && (at < 0 || i < at) {
			at, n = i, len(s)
		}
	}
	return at, n
}

// heldBack is how many bytes at the buffer's end could begin an opening marker.
func (p *Parser) heldBack() int {
	keep := 0
	for _, s := range p.f.starts() {
		for k := min(len(s)-1, len(p.buf)); k > keep; k-- {
			if strings.HasSuffix(p.buf, s[:k]) {
				keep = k
				break
			}
		}
	}
	return keep
}

// text gives out answer text; trailing whitespace waits for what follows when more may.
func (p *Parser) text(d *Delta, s string, more bool) {
	if p.after {
		s = strings.TrimLeft(s, " \t\r\n")
		if s == "" {
			return
		}
		p.after = false
	}
	s = p.ws + s
	p.ws = ""
	if more {
		t := strings.TrimRight(s, " \t\r\n")
		s, p.ws = t, s[len(t):]
	} else {
		s = strings.TrimRight(s, " \t\r\n")
	}
	d.Content += s
	p.content.WriteString(s)
}

// update gives out what is new in the section's calls.
func (p *Parser) update(d *Delta, calls []partial) {
	for i, c := range calls {
		k := p.done + i
		if c.name == "" {
			break
		}
		if k == len(p.sent) {
			p.ws = ""
			p.sent = append(p.sent, sentCall{})
			p.calls = append(p.calls, Call{ID: p.f.NewID()})
		}
		s, call := &p.sent[k], &p.calls[k]
		cd := CallDelta{Index: k}
		if !s.name {
			s.name = true
			call.Name = c.name
			cd.ID, cd.Name = call.ID, c.name
		}
		args := c.args
		if c.complete && args == "" {
			args = "{}"
		}
		if len(args) > s.args && strings.HasPrefix(args, call.Arguments) {
			cd.Args = args[s.args:]
			s.args = len(args)
			call.Arguments = args
		}
		if cd.Name != "" || cd.Args != "" {
			d.Calls = append(d.Calls, cd)
		}
	}
}
