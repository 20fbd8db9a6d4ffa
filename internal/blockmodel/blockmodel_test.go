package blockmodel

import "testing"

func TestDecodeNamesTheWriteAndRefusesDamage(t *testing.T) {
	p := Content(3, 17, 42)
	if seq, err := Decode(3, 17, p); err != nil || seq != 42 {
		t.Fatalf("Decode of write 42: %d, %v", seq, err)
	}
	if seq, err := Decode(3, 17, make([]byte, BlockSize)); err != nil || seq != 0 {
		t.Fatalf("Decode of zeros: %d, %v", seq, err)
	}
	if _, err := Decode(3, 18, p); err == nil {
		t.Fatal("a write to block 17 passed for block 18")
	}
	if _, err := Decode(4, 17, p); err == nil {
		t.Fatal("client 3's write passed for client 4's")
	}
	p[100] ^= 1
	if _, err := Decode(3, 17, p); err == nil {
		t.Fatal("a damaged block passed")
	}
}
