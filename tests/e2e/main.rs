//! The end-to-end suite: podmend installed with the real `helm` into a real control plane
//! (etcd, kube-apiserver, kube-controller-manager, kube-scheduler built from their Go modules),
//! objects created through the API server and read back from it.
//!
//! One test binary owns the control plane's start and stop (`harness = false`): this runner
//! starts it once, runs each test in order, stops it when they are done (a failing test is a
//! caught panic; an uncaught one drops the control plane as it unwinds), and then checks that no
//! component is left running. When the runner dies without unwinding (Ctrl-C, SIGKILL), each
//! component's watchdog sees its pipe close and stops it (`common::control_plane::process`). It prints libtest's lines, so
//! `scripts/test` counts its tests with the others. `cargo test --test e2e -- NAME` runs the
//! tests whose names contain NAME.

mod agent_requests;
mod bench;
#[path = "../common/mod.rs"]
mod common;
mod differential;
mod dind_rm;
mod install;
mod limit_ranger;
mod maintenance;
mod modes;
mod node_affinity;
mod outages;
mod own_webhook;
mod pinniped;
mod placement;
mod real_node;
mod reinvocation;
mod reviews;
mod teardown;
mod templates;
mod tls_rollover;
mod upgrade;
mod virtual_node;

use std::io::Write as _;
use std::panic::AssertUnwindSafe;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Instant;

use common::control_plane::ControlPlane;

/// What every test gets: the control plane, a runtime for the kube client, and podmend once a
/// test installed it.
pub struct Suite {
    pub plane: ControlPlane,
    pub runtime: tokio::runtime::Runtime,
    podmend: Mutex<Option<install::Installed>>,
}

impl Suite {
    /// Runs `future` to completion on the suite's runtime.
    pub fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }
}

/// A test: its name (the sentence it proves) and its body, which panics to fail.
type Test = (&'static str, fn(&Suite));

/// Every test, in the order they run: later ones may use what earlier ones installed.
const TESTS: &[Test] = &[
    (
        "helm_installs_the_chart_and_the_api_server_accepts_every_object_it_renders",
        install::helm_installs_the_chart_and_the_api_server_accepts_every_object_it_renders,
    ),
    (
        "the_pinniped_agent_is_repaired_by_the_api_servers_call_and_bound_to_its_node_by_the_scheduler",
        pinniped::the_pinniped_agent_is_repaired_by_the_api_servers_call_and_bound_to_its_node_by_the_scheduler,
    ),
    (
        "a_pod_pinned_to_a_node_the_cluster_does_not_have_is_stored_as_created_and_kubectl_says_why",
        node_affinity::a_pod_pinned_to_a_node_the_cluster_does_not_have_is_stored_as_created_and_kubectl_says_why,
    ),
    (
        "an_offline_audit_reports_a_pinned_pod_without_a_patch_until_given_a_cluster_snapshot",
        node_affinity::an_offline_audit_reports_a_pinned_pod_without_a_patch_until_given_a_cluster_snapshot,
    ),
    (
        "a_node_under_pressure_is_never_tolerated_so_the_pod_waits_pending_instead_of_being_evicted",
        node_affinity::a_node_under_pressure_is_never_tolerated_so_the_pod_waits_pending_instead_of_being_evicted,
    ),
    (
        "pinned_replicas_with_required_anti_affinity_keep_their_node_name",
        node_affinity::pinned_replicas_with_required_anti_affinity_keep_their_node_name,
    ),
    (
        "a_pod_for_another_scheduler_keeps_its_node_name",
        node_affinity::a_pod_for_another_scheduler_keeps_its_node_name,
    ),
    (
        "a_gated_pod_with_a_node_name_gets_the_api_servers_own_refusal",
        node_affinity::a_gated_pod_with_a_node_name_gets_the_api_servers_own_refusal,
    ),
    (
        "a_pinned_pod_with_a_priority_class_is_rewritten_bound_and_told_it_may_preempt",
        node_affinity::a_pinned_pod_with_a_priority_class_is_rewritten_bound_and_told_it_may_preempt,
    ),
    (
        "a_toleration_the_namespace_whitelist_would_refuse_is_never_added",
        node_affinity::a_toleration_the_namespace_whitelist_would_refuse_is_never_added,
    ),
    (
        "the_jenkins_jnlp_pod_pinned_to_a_node_keeps_its_request_and_gets_no_invented_limit",
        agent_requests::the_jenkins_jnlp_pod_pinned_to_a_node_keeps_its_request_and_gets_no_invented_limit,
    ),
    (
        "a_pod_level_limit_is_never_narrowed_by_container_limits_invented_from_requests",
        agent_requests::a_pod_level_limit_is_never_narrowed_by_container_limits_invented_from_requests,
    ),
    (
        "a_jenkins_build_pod_not_pinned_to_a_node_is_not_touched_by_default",
        agent_requests::a_jenkins_build_pod_not_pinned_to_a_node_is_not_touched_by_default,
    ),
    (
        "with_the_jenkins_preset_on_an_unpinned_build_pod_is_left_alone_and_kubectl_says_why",
        agent_requests::with_the_jenkins_preset_on_an_unpinned_build_pod_is_left_alone_and_kubectl_says_why,
    ),
    (
        "an_agent_pinned_by_node_name_or_by_node_affinity_on_its_name_is_repaired",
        agent_requests::an_agent_pinned_by_node_name_or_by_node_affinity_on_its_name_is_repaired,
    ),
    (
        "the_agent_annotation_opts_in_a_pod_that_is_not_pinned",
        agent_requests::the_agent_annotation_opts_in_a_pod_that_is_not_pinned,
    ),
    (
        "a_guaranteed_agent_with_whole_cpus_is_left_alone_and_kubectl_prints_why",
        agent_requests::a_guaranteed_agent_with_whole_cpus_is_left_alone_and_kubectl_prints_why,
    ),
    (
        "with_zero_exclusive_cpus_a_guaranteed_agent_with_whole_cpus_is_zeroed_and_told_what_it_loses",
        agent_requests::with_zero_exclusive_cpus_a_guaranteed_agent_with_whole_cpus_is_zeroed_and_told_what_it_loses,
    ),
    (
        "the_pinniped_agent_becomes_burstable_and_kubectl_says_what_that_costs",
        agent_requests::the_pinniped_agent_becomes_burstable_and_kubectl_says_what_that_costs,
    ),
    (
        "a_pinned_pod_that_fits_is_bound_by_kube_scheduler_and_one_that_never_fits_waits_pending_for_cpu",
        placement::a_pinned_pod_that_fits_is_bound_by_kube_scheduler_and_one_that_never_fits_waits_pending_for_cpu,
    ),
    (
        "a_pinned_agent_is_bound_by_kube_scheduler_to_a_node_whose_cpu_other_pods_requests_fill",
        placement::a_pinned_agent_is_bound_by_kube_scheduler_to_a_node_whose_cpu_other_pods_requests_fill,
    ),
    (
        "a_pinned_pod_on_a_node_with_a_user_no_schedule_taint_is_tolerated_and_bound_by_kube_scheduler",
        placement::a_pinned_pod_on_a_node_with_a_user_no_schedule_taint_is_tolerated_and_bound_by_kube_scheduler,
    ),
    (
        "a_pinned_pod_on_a_cordoned_node_is_left_pending_by_kube_scheduler",
        placement::a_pinned_pod_on_a_cordoned_node_is_left_pending_by_kube_scheduler,
    ),
    (
        "an_agent_without_resources_keeps_the_limit_range_default_limits_and_requests_zero",
        limit_ranger::an_agent_without_resources_keeps_the_limit_range_default_limits_and_requests_zero,
    ),
    (
        "an_agent_under_a_limit_range_min_requests_that_min_and_keeps_its_limits",
        limit_ranger::an_agent_under_a_limit_range_min_requests_that_min_and_keeps_its_limits,
    ),
    (
        "an_agent_under_a_limit_range_ratio_requests_the_least_the_ratio_allows_and_keeps_its_limits",
        limit_ranger::an_agent_under_a_limit_range_ratio_requests_the_least_the_ratio_allows_and_keeps_its_limits,
    ),
    (
        "with_warn_set_in_the_chart_kubectl_prints_what_podmend_would_repair_and_the_pod_is_stored_as_created",
        modes::with_warn_set_in_the_chart_kubectl_prints_what_podmend_would_repair_and_the_pod_is_stored_as_created,
    ),
    (
        "with_deny_set_in_the_chart_the_api_server_refuses_the_pod_and_kubectl_shows_podmends_message",
        modes::with_deny_set_in_the_chart_the_api_server_refuses_the_pod_and_kubectl_shows_podmends_message,
    ),
    (
        "with_a_rule_off_in_the_chart_the_pod_keeps_what_it_governs_and_the_other_rules_still_repair",
        modes::with_a_rule_off_in_the_chart_the_pod_keeps_what_it_governs_and_the_other_rules_still_repair,
    ),
    (
        "the_charts_match_conditions_keep_skipped_and_mirror_pods_from_podmend_and_a_named_rule_skips_only_that_rule",
        modes::the_charts_match_conditions_keep_skipped_and_mirror_pods_from_podmend_and_a_named_rule_skips_only_that_rule,
    ),
    (
        "the_api_server_never_calls_podmend_for_a_namespace_the_chart_excludes",
        modes::the_api_server_never_calls_podmend_for_a_namespace_the_chart_excludes,
    ),
    (
        "a_deployment_pinned_by_node_name_is_warned_about_on_create_and_update_never_mutated_and_its_pods_are_repaired",
        templates::a_deployment_pinned_by_node_name_is_warned_about_on_create_and_update_never_mutated_and_its_pods_are_repaired,
    ),
    (
        "a_daemon_sets_pod_keeps_the_daemon_set_controllers_own_node_affinity_and_is_bound_by_the_scheduler",
        templates::a_daemon_sets_pod_keeps_the_daemon_set_controllers_own_node_affinity_and_is_bound_by_the_scheduler,
    ),
    (
        "a_jobs_template_on_update_is_left_alone_even_with_templates_enforced_by_the_chart",
        templates::a_jobs_template_on_update_is_left_alone_even_with_templates_enforced_by_the_chart,
    ),
    (
        "a_container_an_injector_adds_after_podmend_has_its_requests_zeroed_when_the_api_server_reinvokes_podmend",
        reinvocation::a_container_an_injector_adds_after_podmend_has_its_requests_zeroed_when_the_api_server_reinvokes_podmend,
    ),
    (
        "a_dind_pod_gets_no_second_guard_when_the_api_server_reinvokes_podmend",
        reinvocation::a_dind_pod_gets_no_second_guard_when_the_api_server_reinvokes_podmend,
    ),
    (
        "a_pod_podmend_already_repaired_gets_no_patch_when_the_api_server_reinvokes_podmend",
        reinvocation::a_pod_podmend_already_repaired_gets_no_patch_when_the_api_server_reinvokes_podmend,
    ),
    (
        "gitlab_and_arc_dind_pods_are_stored_with_the_guard_in_the_daemons_place",
        dind_rm::gitlab_and_arc_dind_pods_are_stored_with_the_guard_in_the_daemons_place,
    ),
    (
        "a_virtual_kubelets_pending_status_with_every_container_running_is_stored_as_running",
        virtual_node::a_virtual_kubelets_pending_status_with_every_container_running_is_stored_as_running,
    ),
    (
        "during_a_podmend_outage_with_podmend_stopped_a_pod_is_stored_unrepaired_well_within_the_webhook_timeout",
        outages::during_a_podmend_outage_with_podmend_stopped_a_pod_is_stored_unrepaired_well_within_the_webhook_timeout,
    ),
    (
        "during_a_podmend_outage_with_podmend_hung_the_api_server_gives_up_at_the_webhook_timeout_and_stores_the_pod_unrepaired",
        outages::during_a_podmend_outage_with_podmend_hung_the_api_server_gives_up_at_the_webhook_timeout_and_stores_the_pod_unrepaired,
    ),
    (
        "after_a_podmend_outage_podmend_restarted_repairs_the_next_pod",
        outages::after_a_podmend_outage_podmend_restarted_repairs_the_next_pod,
    ),
    (
        "a_serving_certificate_renewal_under_the_same_ca_and_a_stream_of_pod_creates_keeps_the_bundle_and_every_pod_is_repaired",
        tls_rollover::a_serving_certificate_renewal_under_the_same_ca_and_a_stream_of_pod_creates_keeps_the_bundle_and_every_pod_is_repaired,
    ),
    (
        "the_emulated_api_server_accepts_refuses_and_defaults_each_pod_as_the_real_one_does",
        differential::the_emulated_api_server_accepts_refuses_and_defaults_each_pod_as_the_real_one_does,
    ),
    (
        "the_emulated_api_server_takes_or_refuses_each_webhook_answer_as_the_real_one_does",
        differential::the_emulated_api_server_takes_or_refuses_each_webhook_answer_as_the_real_one_does,
    ),
    (
        "the_reviews_the_fast_tier_builds_are_the_reviews_the_api_server_sends",
        reviews::the_reviews_the_fast_tier_builds_are_the_reviews_the_api_server_sends,
    ),
    (
        "a_pod_its_controller_creates_is_logged_by_its_generate_name",
        reviews::a_pod_its_controller_creates_is_logged_by_its_generate_name,
    ),
    (
        "a_virtual_kubelet_pod_keeps_its_node_selector_and_tolerations",
        reviews::a_virtual_kubelet_pod_keeps_its_node_selector_and_tolerations,
    ),
    (
        "a_new_taint_seen_on_the_watch_is_used_for_the_next_pod",
        reviews::a_new_taint_seen_on_the_watch_is_used_for_the_next_pod,
    ),
    (
        "a_pinniped_agent_deployment_is_repaired_when_templates_are_enforced",
        reviews::a_pinniped_agent_deployment_is_repaired_when_templates_are_enforced,
    ),
    (
        "monitoring_daemon_sets_keep_the_node_s_socket_and_are_told_why",
        reviews::monitoring_daemon_sets_keep_the_node_s_socket_and_are_told_why,
    ),
    (
        "the_policy_annotation_reaches_the_guard_or_turns_the_rule_off",
        reviews::the_policy_annotation_reaches_the_guard_or_turns_the_rule_off,
    ),
    (
        "a_dind_template_is_warned_about_and_stored_as_written",
        reviews::a_dind_template_is_warned_about_and_stored_as_written,
    ),
    (
        "in_warn_mode_nothing_moves_and_the_warning_says_what_would",
        reviews::in_warn_mode_nothing_moves_and_the_warning_says_what_would,
    ),
    (
        "container_mode_appends_the_guard_as_a_plain_container",
        reviews::container_mode_appends_the_guard_as_a_plain_container,
    ),
    (
        "with_virtual_node_phase_warn_the_status_is_stored_as_written_and_kubectl_says_what_podmend_would_repair",
        virtual_node::with_virtual_node_phase_warn_the_status_is_stored_as_written_and_kubectl_says_what_podmend_would_repair,
    ),
    (
        "jenkins_argo_and_tekton_dind_pods_are_stored_with_the_guard_in_the_daemons_place",
        dind_rm::jenkins_argo_and_tekton_dind_pods_are_stored_with_the_guard_in_the_daemons_place,
    ),
    (
        "a_ca_rollover_under_a_stream_of_pod_creates_never_serves_an_untrusted_certificate_and_every_pod_is_repaired",
        tls_rollover::a_ca_rollover_under_a_stream_of_pod_creates_never_serves_an_untrusted_certificate_and_every_pod_is_repaired,
    ),
    (
        "an_upgrade_with_reset_then_reuse_values_keeps_the_settings_and_gives_a_new_value_its_default",
        upgrade::an_upgrade_with_reset_then_reuse_values_keeps_the_settings_and_gives_a_new_value_its_default,
    ),
    (
        "a_dind_pod_in_a_namespace_whose_quota_covers_cpu_limits_is_admitted_with_its_guard",
        dind_rm::a_dind_pod_in_a_namespace_whose_quota_covers_cpu_limits_is_admitted_with_its_guard,
    ),
    (
        "helm_uninstall_leaves_nothing_that_touches_or_blocks_pod_creation",
        install::helm_uninstall_leaves_nothing_that_touches_or_blocks_pod_creation,
    ),
    // After podmend is uninstalled: these pods are the kubelet's to judge, unrepaired.
    (
        "a_pod_the_kubelet_runs_is_running_with_its_output_in_kubectl_logs_and_leaves_nothing_behind",
        real_node::a_pod_the_kubelet_runs_is_running_with_its_output_in_kubectl_logs_and_leaves_nothing_behind,
    ),
    (
        "the_kubelet_fails_a_pod_whose_cpu_request_exceeds_its_allocatable_with_out_of_cpu",
        real_node::the_kubelet_fails_a_pod_whose_cpu_request_exceeds_its_allocatable_with_out_of_cpu,
    ),
    (
        "a_node_whose_kubelet_stops_with_its_pod_still_running_leaves_nothing_behind",
        real_node::a_node_whose_kubelet_stops_with_its_pod_still_running_leaves_nothing_behind,
    ),
    (
        "a_namespace_being_deleted_is_skipped_by_the_report_refresh_which_goes_on_with_the_others_and_the_clean_up",
        maintenance::a_namespace_being_deleted_is_skipped_by_the_report_refresh_which_goes_on_with_the_others_and_the_clean_up,
    ),
    (
        "an_expired_continue_token_is_followed_with_the_token_the_410_carries_and_every_pod_is_planned_once",
        maintenance::an_expired_continue_token_is_followed_with_the_token_the_410_carries_and_every_pod_is_planned_once,
    ),
    (
        "a_suite_that_panics_or_is_killed_leaves_no_component_running",
        teardown::a_suite_that_panics_or_is_killed_leaves_no_component_running,
    ),
];

/// The check that runs after the control plane stopped.
const LEFT_RUNNING: &str = "no_control_plane_component_outlives_the_suite";

fn main() -> ExitCode {
    if let Some(code) = teardown::child_mode() {
        return code;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|arg| arg == "--bench-pod-create") {
        return bench_mode(&args);
    }
    let filter = args.iter().find(|arg| !arg.starts_with('-')).cloned();
    let selected: Vec<&Test> = TESTS
        .iter()
        .filter(|(name, _)| filter.as_deref().is_none_or(|f| name.contains(f)))
        .collect();
    if args.iter().any(|arg| arg == "--list") {
        for (name, _) in &selected {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let started = Instant::now();
    if selected.is_empty() {
        println!(
            "\nrunning 0 tests\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; {} filtered out; finished in 0.00s\n",
            TESTS.len()
        );
        return ExitCode::SUCCESS;
    }
    println!("\nrunning {} tests", selected.len() + 1);
    let suite = match start_suite() {
        Ok(suite) => suite,
        Err(error) => {
            println!("test control_plane_starts ... FAILED\n\n{error}");
            println!(
                "\ntest result: FAILED. 0 passed; {} failed; 0 ignored; 0 measured; 0 filtered out; finished in {:.2}s\n",
                selected.len() + 1,
                started.elapsed().as_secs_f64()
            );
            return ExitCode::FAILURE;
        }
    };
    let dir = suite.plane.dir().to_path_buf();

    let mut failures = Vec::new();
    for (name, test) in &selected {
        print!("test {name} ... ");
        let _ = std::io::stdout().flush();
        let began = Instant::now();
        match std::panic::catch_unwind(AssertUnwindSafe(|| test(&suite))) {
            Ok(()) => println!("ok ({:.1} s)", began.elapsed().as_secs_f64()),
            Err(panic) => {
                println!("FAILED ({:.1} s)", began.elapsed().as_secs_f64());
                failures.push((name.to_string(), panic_text(&*panic)));
            }
        }
    }
    if !failures.is_empty() {
        println!(
            "\nthe control plane's components when the suite ended:\n{}",
            suite.plane.report()
        );
    }
    drop(suite);

    print!("test {LEFT_RUNNING} ... ");
    let left = common::control_plane::process::processes_mentioning(&dir);
    if left.is_empty() {
        println!("ok");
    } else {
        println!("FAILED");
        failures.push((
            LEFT_RUNNING.to_string(),
            format!(
                "still running after the suite stopped its control plane:\n{}",
                left.join("\n")
            ),
        ));
    }
    let total = selected.len() + 1;
    if !failures.is_empty() {
        println!("\nfailures:");
        for (name, text) in &failures {
            println!("\n---- {name} ----\n{text}");
        }
    }
    println!(
        "\ntest result: {}. {} passed; {} failed; 0 ignored; 0 measured; {} filtered out; finished in {:.2}s\n",
        if failures.is_empty() { "ok" } else { "FAILED" },
        total - failures.len(),
        failures.len(),
        TESTS.len() - selected.len(),
        started.elapsed().as_secs_f64()
    );
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// A panic's message.
/// The control plane started, and a runtime for the kube client: what every test gets.
fn start_suite() -> Result<Suite, String> {
    common::server::install_crypto_provider();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("a tokio runtime: {e}"))?;
    let plane = runtime.block_on(ControlPlane::start())?;
    println!(
        "control plane: kube-apiserver {} at {} (etcd, kube-controller-manager, kube-scheduler and kubectl of the same build; helm {})",
        plane.version,
        plane.server,
        plane.binaries.helm.display()
    );
    Ok(Suite {
        plane,
        runtime,
        podmend: Mutex::new(None),
    })
}

/// `--bench-pod-create [--rounds=R] [--pods=N]`: the pod-create benchmark (`bench.rs`)
/// instead of the tests.
fn bench_mode(args: &[String]) -> ExitCode {
    let plan = match bench::Plan::from_args(args) {
        Ok(plan) => plan,
        Err(error) => {
            eprintln!("--bench-pod-create: {error}");
            return ExitCode::from(2);
        }
    };
    let suite = match start_suite() {
        Ok(suite) => suite,
        Err(error) => {
            eprintln!("the control plane did not start:\n{error}");
            return ExitCode::FAILURE;
        }
    };
    match std::panic::catch_unwind(AssertUnwindSafe(|| bench::pod_create(&suite, &plan))) {
        Ok(table) => {
            println!("\n{table}");
            ExitCode::SUCCESS
        }
        Err(panic) => {
            eprintln!("the benchmark failed: {}", panic_text(&*panic));
            ExitCode::FAILURE
        }
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// Locks `mutex`, also after a test panicked holding it.
pub fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
