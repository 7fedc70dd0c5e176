// A small WebAudio synth for the score's timeline (from /yue2/abc/analyze): the Vocal melody, the Ins voice and the
// chord symbols, each an oscillator per note with a short attack/decay/release envelope. Notes are scheduled a little
// ahead of time by a timer (a "look-ahead scheduler"), so a long song never creates thousands of nodes at once, and
// the same timer reports the play position for the cursor.

const LOOKAHEAD_S = 0.35; // schedule notes starting within this window
const TICK_MS = 40; // scheduler + cursor period
const START_DELAY_S = 0.08; // first note a little after "now", so its attack is not cut
const RELEASE_S = 0.06;

// Per part: oscillator wave, peak gain, sustain level (fraction of peak), optional low-pass (Hz).
const PARTS = {
    Vocal: { wave: "triangle", peak: 0.3, sustain: 0.7 },
    Ins: { wave: "sawtooth", peak: 0.1, sustain: 0.5, lowpass: 1800 },
    chord: { wave: "sine", peak: 0.05, sustain: 0.6 },
};

export function midiToHz(midi) {
    return 440 * 2 ** ((midi - 69) / 12);
}

/** Flatten a timeline into time-ordered events: {start, dur, midi, part}. */
export function timelineEvents(timeline, { chords = true } = {}) {
    const events = [];
    for (const [voice, notes] of Object.entries(timeline?.voices || {})) {
        const part = voice === "Vocal" ? "Vocal" : "Ins";
        for (const n of notes || []) events.push({ start: n.start_s, dur: n.dur_s, midi: n.midi, part });
    }
    if (chords) {
        for (const c of timeline?.chords || []) {
            for (const midi of c.midis || []) events.push({ start: c.start_s, dur: c.dur_s, midi, part: "chord" });
        }
    }
    return events
        .filter((e) => Number.isFinite(e.start) && Number.isFinite(e.dur) && e.dur > 0 && Number.isFinite(e.midi))
        .sort((a, b) => a.start - b.start);
}

export class Player {
    /** onTick(seconds) while playing; onStateChange(playing) when it starts or stops. */
    constructor({ onTick, onStateChange }) {
        this.onTick = onTick;
        this.onStateChange = onStateChange;
        this.context = null;
        this.timer = null;
        this.sounding = new Set();
        this.playing = false;
    }

    /** AudioContext state for the UI and tests: "none" before the first Play, then the context's own state. */
    get audioState() {
        return this.context ? this.context.state : "none";
    }

    ensureContext() {
        if (!this.context) {
            const Context = window.AudioContext || window.webkitAudioContext;
            if (!Context) throw new Error("This browser has no Web Audio API.");
            this.context = new Context();
            this.master = this.context.createGain();
            this.master.gain.value = 0.8;
            const limiter = this.context.createDynamicsCompressor(); // chords + two voices must not clip
            this.master.connect(limiter).connect(this.context.destination);
        }
        return this.context;
    }

    /** Play `timeline` from `from` seconds. Must be called from a user gesture (browsers start audio only then). */
    async play(timeline, { from = 0 } = {}) {
        this.stop();
        const context = this.ensureContext();
        if (context.state !== "running") await context.resume();
        this.events = timelineEvents(timeline).filter((e) => e.start + e.dur > from);
        // a timeline the server cut (cut_s: the score has more notes than it sends) ends there, not at duration_s
        const end = Number(timeline?.cut_s ?? timeline?.duration_s) || 0;
        this.duration = this.events.reduce((last, e) => Math.max(last, e.start + e.dur), end);
        this.next = 0;
        this.offset = from;
        this.t0 = context.currentTime + START_DELAY_S - from; // audio time of score time 0
        this.playing = true;
        this.onStateChange?.(true);
        this.tick();
        this.timer = setInterval(() => this.tick(), TICK_MS);
    }

    stop() {
        if (this.timer) clearInterval(this.timer);
        this.timer = null;
        const now = this.context ? this.context.currentTime : 0;
        for (const voice of this.sounding) {
            try {
                voice.gain.gain.cancelScheduledValues(now);
                voice.gain.gain.setTargetAtTime(0, now, 0.01);
                voice.osc.stop(now + 0.05);
            } catch (e) {
                /* already stopped */
            }
        }
        this.sounding.clear();
        if (this.playing) {
            this.playing = false;
            this.onStateChange?.(false);
        }
    }

    /** Current score time in seconds (meaningful while playing). */
    position() {
        return this.context ? this.context.currentTime - this.t0 : 0;
    }

    tick() {
        const now = this.position();
        while (this.next < this.events.length && this.events[this.next].start < now + LOOKAHEAD_S) {
            const e = this.events[this.next++];
            if (e.start + e.dur > now) this.schedule(e);
        }
        if (now > this.duration + RELEASE_S) {
            this.stop();
            return;
        }
        this.onTick?.(Math.max(this.offset, now));
    }

    schedule(event) {
        const ctx = this.context;
        const spec = PARTS[event.part];
        const start = Math.max(ctx.currentTime, this.t0 + event.start);
        const end = Math.max(start + 0.03, this.t0 + event.start + event.dur);
        const osc = ctx.createOscillator();
        osc.type = spec.wave;
        osc.frequency.value = midiToHz(event.midi);
        const gain = ctx.createGain();
        // Envelope: 10 ms attack to the peak, decay towards the sustain level, release after the note's end.
        gain.gain.setValueAtTime(0, start);
        gain.gain.linearRampToValueAtTime(spec.peak, start + 0.01);
        gain.gain.setTargetAtTime(spec.peak * spec.sustain, start + 0.01, 0.08);
        gain.gain.setTargetAtTime(0, end, RELEASE_S / 3);
        let last = osc;
        if (spec.lowpass) {
            const filter = ctx.createBiquadFilter();
            filter.type = "lowpass";
            filter.frequency.value = spec.lowpass;
            last = last.connect(filter);
        }
        last.connect(gain).connect(this.master);
        const voice = { osc, gain };
        this.sounding.add(voice);
        osc.onended = () => {
            this.sounding.delete(voice);
            gain.disconnect();
        };
        osc.start(start);
        osc.stop(end + RELEASE_S * 2);
    }

    /** Stop and release the audio device (node removed). */
    dispose() {
        this.stop();
        this.context?.close?.();
        this.context = null;
    }
}
