package offload

import (
	"bytes"
	"errors"
	"testing"

	"github.com/commit-run/commit-run/models"
)

func loadTiny(t *testing.T) *models.Model {
	t.Helper()
	f, err := models.Open("../models/testdata/tiny.gguf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	m, err := models.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestStoreHoldsEveryExpert(t *testing.T) {
	m := loadTiny(t)
	for _, zero := range []bool{false, true} {
		s, err := NewStore(m, StoreOptions{ZeroCopy: zero})
		if err != nil {
			t.Fatal(err)
		}
		if len(s.Layers()) != len(m.Layers) {
			t.Fatalf("%d MoE layers in the store, the model has %d", len(s.Layers()), len(m.Layers))
		}
		for _, i := range s.Layers() {
			moe := m.Layers[i].MoE
			l, err := s.Layout(i)
			if err != nil {
				t.Fatal(err)
			}
			if l.Bytes > s.SlotBytes() || l.Gate.Off%regionAlign != 0 || l.Up.Off%regionAlign != 0 || l.Down.Off%regionAlign != 0 {
				t.Errorf("layer %d: layout %+v, slot %d", i, l, s.SlotBytes())
			}
			for e := 0; e < moe.Experts; e++ {
				k := ExpertKey{i, e}
				w, err := s.Expert(k)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(w.Gate.Data, moe.GateExps.Expert(e).Data) || !bytes.Equal(w.Up.Data, moe.UpExps.Expert(e).Data) ||
					!bytes.Equal(w.Down.Data, moe.DownExps.Expert(e).Data) || w.Down.Rows != moe.DownExps.Expert(e).Rows {
					t.Fatalf("%v (zero copy %v): weights differ from the file", k, zero)
				}
				if zero {
					continue
				}
				// A region copied elsewhere (a device slot) reads back as the same expert.
				r, err := s.Region(k)
				if err != nil {
					t.Fatal(err)
				}
				slot := make([]byte, s.SlotBytes())
				copy(slot, r)
				if v := l.View(slot); !bytes.Equal(v.Gate.Data, w.Gate.Data) || !bytes.Equal(v.Down.Data, w.Down.Data) {
					t.Fatalf("%v: slot view differs", k)
				}
			}
		}
		if zero && s.Bytes() != 0 {
			t.Errorf("zero-copy store holds %d bytes", s.Bytes())
		}
	}
}

func TestStoreErrors(t *testing.T) {
	m := loadTiny(t)
	s, err := NewStore(m, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []ExpertKey{{-1, 0}, {len(m.Layers), 0}, {0, -1}, {0, m.Layers[0].MoE.Experts}} {
		if _, err := s.Expert(k); err == nil {
			t.Errorf("Expert(%v): no error", k)
		}
		if _, err := s.Region(k); err == nil {
			t.Errorf("Region(%v): no error", k)
		}
	}
	boom := errors.New("no pinned memory")
	if _, err := NewStore(m, StoreOptions{Alloc: func(int64) ([]byte, error) { return nil, boom }}); !errors.Is(err, boom) {
		t.Errorf("failing allocator: %v", err)
	}
	if _, err := NewStore(m, StoreOptions{Alloc: func(n int64) ([]byte, error) { return make([]byte, n-1), nil }}); err == nil {
		t.Error("short allocation: no error")
	}
}
