//! Deadline-aware choice between spot and on-demand instances.
//!
//! The policies of "Can't Be Late: Optimizing Spot Instance Savings under
//! Deadlines" (Wu et al., NSDI 2024). A job needs `job_length` seconds of
//! work and must be done `deadline` seconds after it starts. Every
//! `tick` seconds a [`Policy`] looks at the [`State`] and picks a
//! [`Choice`]: run on spot, run on on-demand, or run nothing. Starting on a
//! new instance costs `restart_overhead` seconds that are billed but make no
//! progress (checkpoints keep the work done so far, so nothing else is lost).
//!
//! Pure logic: no IO, no clock. The trace simulator (`jobs::sim`) drives it
//! over recorded spot availability; the managed-job controller drives it
//! over the real thing.
//!
//! # The guarantee
//!
//! [`Greedy`] and [`UniformProgress`] never miss a deadline that on-demand
//! alone could meet (`job_length + restart_overhead <= deadline`). Both keep
//! this invariant at every decision: *the job could still finish by the
//! deadline by switching to on-demand now*, i.e. `elapsed +
//! State::on_demand_need() <= deadline`. Running on on-demand keeps it
//! (progress and time advance together). Any other choice is taken only if
//! the invariant still holds one tick later in the worst case: the spot
//! instance is gone at the next tick and on-demand has to be started from
//! scratch, paying the restart overhead again ([`State::keeps_deadline`]).
//! When no other choice passes that test the policy commits to on-demand
//! until the job ends.

/// What the job runs on during one tick (or, in [`State::running`], what
/// it is on when the tick starts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Choice {
    /// A spot instance (cheap, may be preempted at any tick boundary).
    Spot,
    /// An on-demand instance (dear, never preempted).
    OnDemand,
    /// No instance: nothing billed, no progress.
    Idle,
}

/// What a policy sees at the start of a tick. Times are in seconds from the
/// job's start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct State {
    /// Time since the job started.
    pub(crate) elapsed: f64,
    /// Work done so far (seconds of progress).
    pub(crate) work_done: f64,
    /// Total work the job needs.
    pub(crate) job_length: f64,
    /// When the job must be done.
    pub(crate) deadline: f64,
    /// Time lost (billed, no progress) whenever the job starts on a new
    /// instance.
    pub(crate) restart_overhead: f64,
    /// Time until the next decision.
    pub(crate) tick: f64,
    /// Whether a spot instance can be had now (or the current one is still
    /// running).
    pub(crate) spot_available: bool,
    /// The instance the job is on now: [`Choice::Idle`] when none (also just
    /// after a preemption). A [`Choice::Spot`] here is alive.
    pub(crate) running: Choice,
    /// Restart overhead still to pay on the current instance before it
    /// makes progress again.
    pub(crate) overhead_left: f64,
}

impl State {
    /// Work still to do.
    pub(crate) fn remaining_work(&self) -> f64 {
        (self.job_length - self.work_done).max(0.0)
    }

    /// The uniform-progress line C(t) = job_length × t / deadline, capped at
    /// the job length.
    pub(crate) fn expected_progress(&self, at: f64) -> f64 {
        if self.deadline <= 0.0 {
            return self.job_length;
        }
        (self.job_length * at / self.deadline).clamp(0.0, self.job_length)
    }

    /// Time needed to finish if the job goes (or stays) on on-demand now:
    /// the remaining work plus the overhead of starting it, or what is left
    /// of that overhead when it already runs there.
    pub(crate) fn on_demand_need(&self) -> f64 {
        let overhead = if self.running == Choice::OnDemand {
            self.overhead_left
        } else {
            self.restart_overhead
        };
        self.remaining_work() + overhead
    }

    /// Whether going to on-demand now still meets the deadline.
    pub(crate) fn can_finish_on_demand(&self) -> bool {
        self.elapsed + self.on_demand_need() <= self.deadline
    }

    /// Overhead to pay before `c` makes progress: what is left of it when
    /// `c` continues the current instance, the full restart overhead when
    /// it starts a new one, none for idling.
    pub(crate) fn overhead_for(&self, c: Choice) -> f64 {
        match c {
            Choice::Idle => 0.0,
            c if c == self.running => self.overhead_left,
            _ => self.restart_overhead,
        }
    }

    /// Progress `c` makes in this tick if it is not interrupted.
    pub(crate) fn progress_in_tick(&self, c: Choice) -> f64 {
        if c == Choice::Idle {
            return 0.0;
        }
        (self.tick - self.overhead_for(c)).clamp(0.0, self.remaining_work())
    }

    /// The safety net: whether choosing `c` for this tick keeps the
    /// deadline reachable on on-demand whatever spot does next.
    ///
    /// - On-demand: `elapsed + on_demand_need() <= deadline`.
    /// - Spot or idle, if `c` finishes the job within the tick: when it
    ///   finishes (`elapsed + overhead + remaining work`) is not after the
    ///   deadline.
    /// - Otherwise: `elapsed + tick + (remaining work after the tick) +
    ///   restart_overhead <= deadline`, i.e. at the next tick on-demand can
    ///   still be started from scratch and finish in time.
    pub(crate) fn keeps_deadline(&self, c: Choice) -> bool {
        if c == Choice::OnDemand {
            return self.can_finish_on_demand();
        }
        let remaining = self.remaining_work();
        if c != Choice::Idle {
            let overhead = self.overhead_for(c);
            if self.tick - overhead >= remaining {
                return self.elapsed + overhead + remaining <= self.deadline;
            }
        }
        let after = remaining - self.progress_in_tick(c);
        self.elapsed + self.tick + after + self.restart_overhead <= self.deadline
    }
}

/// Decides, tick by tick, what a job runs on. A policy may keep state
/// between ticks (build a fresh one per job).
pub(crate) trait Policy {
    /// The policy's name, as the CLI spells it.
    fn name(&self) -> &'static str;

    /// What to run on for the next tick. [`Choice::Spot`] only when
    /// `s.spot_available`.
    fn decide(&mut self, s: &State) -> Choice;
}

/// The policies gangway ships, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum PolicyKind {
    /// [`Greedy`].
    Greedy,
    /// [`UniformProgress`].
    UniformProgress,
    /// [`AlwaysOnDemand`].
    AlwaysOnDemand,
}

impl PolicyKind {
    /// Every policy, in the order reports list them.
    pub(crate) const ALL: [PolicyKind; 3] = [
        PolicyKind::Greedy,
        PolicyKind::UniformProgress,
        PolicyKind::AlwaysOnDemand,
    ];

    /// The policy's name.
    #[cfg(test)]
    pub(crate) fn name(self) -> &'static str {
        match self {
            PolicyKind::Greedy => Greedy::NAME,
            PolicyKind::UniformProgress => UniformProgress::NAME,
            PolicyKind::AlwaysOnDemand => AlwaysOnDemand::NAME,
        }
    }

    /// A fresh policy of this kind.
    pub(crate) fn build(self) -> Box<dyn Policy> {
        match self {
            PolicyKind::Greedy => Box::new(Greedy::default()),
            PolicyKind::UniformProgress => Box::new(UniformProgress::default()),
            PolicyKind::AlwaysOnDemand => Box::new(AlwaysOnDemand),
        }
    }
}

/// Spot whenever there is spot; otherwise wait, as long as waiting is safe.
///
/// At each tick, in order:
/// 1. Once committed to on-demand: on-demand, to the end.
/// 2. The wish is spot when spot is available, idle when it is not.
/// 3. If the wish fails [`State::keeps_deadline`] (waiting or running spot
///    one more tick could make the deadline impossible), commit to
///    on-demand instead; otherwise take the wish.
///
/// Once forced onto on-demand the slack left is less than one tick plus a
/// restart, so going back to spot would risk the deadline: like the
/// paper's greedy policy it stays on on-demand.
#[derive(Clone, Debug, Default)]
pub(crate) struct Greedy {
    committed: bool,
}

impl Greedy {
    /// The CLI name.
    pub(crate) const NAME: &'static str = "greedy";
}

impl Policy for Greedy {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn decide(&mut self, s: &State) -> Choice {
        if self.committed {
            return Choice::OnDemand;
        }
        let wish = if s.spot_available {
            Choice::Spot
        } else {
            Choice::Idle
        };
        if s.keeps_deadline(wish) {
            wish
        } else {
            self.committed = true;
            Choice::OnDemand
        }
    }
}

/// The paper's Uniform Progress: keep the work done at or above the line
/// C(t) = job_length × t / deadline, using on-demand only to catch up.
///
/// With `w` the work done, `t` the elapsed time and `d` the restart
/// overhead, at each tick, in order:
/// 1. Committed (safety net fired earlier): on-demand, to the end.
/// 2. Hysteresis: on on-demand, stay there unless spot is available,
///    `w >= C(t + 2d)` and more than `d` of work is left. On-demand is left
///    only for spot, and only once the job is ahead of the line by two
///    restart overheads' worth, so it never flaps between on-demand and
///    idle around the line (each flap would pay another restart). Near the
///    end (`C` is capped at the job length, so any `w` is "ahead" there)
///    a move would pay a whole restart to save at most `d`: it stays. (Not
///    in the paper, whose ticks are long; a managed job's checkpoint can
///    show all the work done while the on-demand run is still exiting, and
///    leaving then killed a finishing run to restart it on spot.)
/// 3. Exploitation, taking risks: spot available: spot (stay on a running
///    spot instance; start one even while behind the line).
/// 4. Uniform progress: no spot and `w < C(t)`: on-demand.
/// 5. Otherwise (no spot, not on on-demand, on or ahead of the line):
///    idle.
/// 6. Safety net: if the choice of 2-5 is not on-demand and fails
///    [`State::keeps_deadline`], commit to on-demand until the end. (The
///    paper's safety net switches when the remaining time is under the
///    remaining work plus 2d; this exact one-tick look-ahead is what makes
///    the never-miss guarantee hold for any tick length.)
#[derive(Clone, Debug, Default)]
pub(crate) struct UniformProgress {
    committed: bool,
}

impl UniformProgress {
    /// The CLI name.
    pub(crate) const NAME: &'static str = "uniform-progress";
}

impl Policy for UniformProgress {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn decide(&mut self, s: &State) -> Choice {
        if self.committed {
            return Choice::OnDemand;
        }
        let w = s.work_done;
        let wish = if s.running == Choice::OnDemand
            && (!s.spot_available
                || w < s.expected_progress(s.elapsed + 2.0 * s.restart_overhead)
                || s.remaining_work() <= s.restart_overhead)
        {
            Choice::OnDemand
        } else if s.spot_available {
            Choice::Spot
        } else if w < s.expected_progress(s.elapsed) {
            Choice::OnDemand
        } else {
            Choice::Idle
        };
        if wish == Choice::OnDemand || s.keeps_deadline(wish) {
            wish
        } else {
            self.committed = true;
            Choice::OnDemand
        }
    }
}

/// On-demand from start to end: the baseline that costs the most and never
/// waits.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct AlwaysOnDemand;

impl AlwaysOnDemand {
    /// The CLI name.
    pub(crate) const NAME: &'static str = "on-demand";
}

impl Policy for AlwaysOnDemand {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn decide(&mut self, _: &State) -> Choice {
        Choice::OnDemand
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: f64 = 3600.0;

    /// A 10 h job due in 15 h, 0.5 h restarts, 1 h ticks, nothing running.
    fn state(elapsed_h: f64, work_h: f64, spot: bool) -> State {
        State {
            elapsed: elapsed_h * H,
            work_done: work_h * H,
            job_length: 10.0 * H,
            deadline: 15.0 * H,
            restart_overhead: 0.5 * H,
            tick: H,
            spot_available: spot,
            running: Choice::Idle,
            overhead_left: 0.0,
        }
    }

    #[test]
    fn expected_progress_is_the_uniform_line() {
        let s = state(0.0, 0.0, false);
        assert_eq!(s.expected_progress(0.0), 0.0);
        assert!((s.expected_progress(7.5 * H) - 5.0 * H).abs() < 1e-9);
        assert_eq!(s.expected_progress(20.0 * H), 10.0 * H);
    }

    #[test]
    fn on_demand_need_counts_the_restart_unless_already_there() {
        let mut s = state(2.0, 4.0, false);
        assert_eq!(s.on_demand_need(), 6.5 * H);
        s.running = Choice::OnDemand;
        s.overhead_left = 0.25 * H;
        assert_eq!(s.on_demand_need(), 6.25 * H);
        s.running = Choice::Spot;
        assert_eq!(s.on_demand_need(), 6.5 * H);
    }

    #[test]
    fn keeps_deadline_looks_one_tick_ahead() {
        // Idle at 3.5 h: 3.5 + 1 + 10 + 0.5 = 15: just safe.
        assert!(state(3.5, 0.0, false).keeps_deadline(Choice::Idle));
        assert!(!state(3.6, 0.0, false).keeps_deadline(Choice::Idle));
        // A new spot instance makes 0.5 h of progress in the tick.
        assert!(state(4.0, 0.0, true).keeps_deadline(Choice::Spot));
        assert!(!state(4.1, 0.0, true).keeps_deadline(Choice::Spot));
        // Continuing a running spot instance makes a full hour.
        let mut s = state(4.5, 0.0, true);
        s.running = Choice::Spot;
        assert!(s.keeps_deadline(Choice::Spot));
        assert!(!s.keeps_deadline(Choice::Idle));
        // Finishing within the tick is safe when it ends by the deadline.
        let mut s = state(14.1, 9.5, true);
        s.running = Choice::Spot;
        assert!(s.keeps_deadline(Choice::Spot));
        // A new instance would finish at 14.1 + 0.5 + 0.5 > 15.
        assert!(!state(14.1, 9.5, true).keeps_deadline(Choice::Spot));
    }

    #[test]
    fn greedy_takes_spot_waits_then_commits_to_on_demand() {
        let mut p = Greedy::default();
        assert_eq!(p.decide(&state(0.0, 0.0, true)), Choice::Spot);
        assert_eq!(p.decide(&state(1.0, 1.0, false)), Choice::Idle);
        // 4.5 + 1 + 9 + 0.5 = 15: waiting one more tick is still safe.
        assert_eq!(p.decide(&state(4.5, 1.0, false)), Choice::Idle);
        // 4.6 + 1 + 9 + 0.5 > 15: it is not.
        assert_eq!(p.decide(&state(4.6, 1.0, false)), Choice::OnDemand);
        // Committed: spot coming back does not lure it away.
        let mut s = state(5.7, 1.5, true);
        s.running = Choice::OnDemand;
        assert_eq!(p.decide(&s), Choice::OnDemand);
    }

    #[test]
    fn uniform_progress_goes_on_demand_only_when_behind() {
        let mut p = UniformProgress::default();
        // On the line at t = 0: wait.
        assert_eq!(p.decide(&state(0.0, 0.0, false)), Choice::Idle);
        // Ahead of the line (C(3 h) = 2 h): wait.
        assert_eq!(p.decide(&state(3.0, 2.5, false)), Choice::Idle);
        // Behind: on-demand.
        assert_eq!(p.decide(&state(3.0, 1.5, false)), Choice::OnDemand);
        // Behind but spot is there: take the risk on spot.
        assert_eq!(p.decide(&state(3.0, 1.5, true)), Choice::Spot);
    }

    #[test]
    fn uniform_progress_keeps_on_demand_until_ahead_by_two_restarts() {
        let mut p = UniformProgress::default();
        let on_od = |elapsed, work, spot| {
            let mut s = state(elapsed, work, spot);
            s.running = Choice::OnDemand;
            s
        };
        // C(3 h) = 2 h, C(3 h + 2 × 0.5 h) = 2.67 h.
        assert_eq!(p.decide(&on_od(3.0, 2.1, true)), Choice::OnDemand);
        assert_eq!(p.decide(&on_od(3.0, 2.6, false)), Choice::OnDemand);
        // Ahead of C(t + 2d): released to spot if there is spot, kept
        // otherwise (no flapping between on-demand and idle).
        assert_eq!(p.decide(&on_od(3.0, 2.7, true)), Choice::Spot);
        assert_eq!(p.decide(&on_od(3.0, 2.7, false)), Choice::OnDemand);
        assert_eq!(p.decide(&on_od(3.0, 9.0, false)), Choice::OnDemand);
        // Near the end, finishing costs less than a restart: kept, spot or
        // not (job length 10 h, d = 0.5 h).
        assert_eq!(p.decide(&on_od(9.0, 9.6, true)), Choice::OnDemand);
        assert_eq!(p.decide(&on_od(9.0, 10.0, true)), Choice::OnDemand);
        assert_eq!(p.decide(&on_od(8.0, 9.4, true)), Choice::Spot);
        // Idle and ahead: stays idle.
        assert_eq!(p.decide(&state(3.0, 2.7, false)), Choice::Idle);
    }

    #[test]
    fn uniform_progress_safety_net_commits() {
        let mut p = UniformProgress::default();
        // Ahead of the line (C(4.5 h) = 3 h), and idling one more tick
        // leaves 15 - 5.5 = 9.5 h for 6 h of work plus a restart: idle.
        assert_eq!(p.decide(&state(4.5, 4.0, false)), Choice::Idle);
        // Spot, but behind so badly that a preemption could not be
        // recovered: on-demand, and it stays there.
        assert_eq!(p.decide(&state(4.0, 0.0, true)), Choice::Spot);
        assert_eq!(p.decide(&state(4.2, 0.0, true)), Choice::OnDemand);
        // Far ahead of the line with spot there, which would release
        // on-demand, but the policy is committed.
        let mut s = state(5.0, 9.0, true);
        s.running = Choice::OnDemand;
        assert_eq!(p.decide(&s), Choice::OnDemand);
        assert_eq!(UniformProgress::default().decide(&s), Choice::Spot);
    }

    #[test]
    fn always_on_demand_is_always_on_demand() {
        let mut p = AlwaysOnDemand;
        assert_eq!(p.decide(&state(0.0, 0.0, true)), Choice::OnDemand);
        assert_eq!(p.name(), "on-demand");
        for k in PolicyKind::ALL {
            assert_eq!(k.build().name(), k.name());
        }
    }
}
