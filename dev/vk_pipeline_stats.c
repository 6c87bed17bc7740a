// vk_pipeline_stats: compiles compute pipelines on a Vulkan device and prints what the driver reports about
// them (VK_KHR_pipeline_executable_properties): statistics (instructions, VGPRs, SGPRs, LDS, waves per SIMD)
// and internal representations (the ISA text). Built at run time by dev/gpu_isa.py into the
// cache; meant for Mesa RADV's null device (RADV_FORCE_FAMILY=gfx1100 etc.), where pipelines compile to real
// AMD ISA while nothing can execute.
//
//   vk_pipeline_stats --device          one JSON object: the device's name, vendor, subgroup properties and
//                                       packed int8 dot product support
//   vk_pipeline_stats JOBS OUTDIR       JOBS: one pipeline a line, "NAME SPV_PATH SUBGROUP_SIZE [robust]
//                                       ID=VALUE..."; per job OUTDIR/NAME.json (statistics) and
//                                       OUTDIR/NAME.<repr>.txt
//
// Every pipeline gets ggml-vulkan's creation parameters: the specialization constants given (32-bit unsigned),
// a required subgroup size (0: none) with full subgroups, robust buffer access only where the job says
// "robust" (ggml-vulkan turns it off for its mat-vec pipelines, not for its matrix multiplies), eight storage
// buffers in set 0 (more than any measured shader binds) and a 128-byte push constant range. The device is
// created with every feature it has, shaderIntegerDotProduct included where it has
// VK_KHR_shader_integer_dot_product (or Vulkan 1.3), as ggml-vulkan enables it for the shaders that use OpSDot
// (the q8_1 mat-vec).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vulkan/vulkan.h>

#define MAX_SPEC   16
#define N_BINDINGS 8

static void die(const char * what, VkResult r) {
    fprintf(stderr, "vk_pipeline_stats: %s failed (VkResult %d)\n", what, (int) r);
    exit(1);
}

static void json_string(FILE * f, const char * s) {
    fputc('"', f);
    for (; *s; ++s) {
        if (*s == '"' || *s == '\\') {
            fputc('\\', f);
            fputc(*s, f);
        } else if ((unsigned char) *s < 0x20) {
            fprintf(f, "\\u%04x", (unsigned char) *s);
        } else {
            fputc(*s, f);
        }
    }
    fputc('"', f);
}

static void * read_file(const char * path, size_t * size) {
    FILE * f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "vk_pipeline_stats: cannot open %s\n", path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    *size = (size_t) ftell(f);
    fseek(f, 0, SEEK_SET);
    void * data = malloc(*size);
    if (fread(data, 1, *size, f) != *size) {
        fprintf(stderr, "vk_pipeline_stats: cannot read %s\n", path);
        exit(1);
    }
    fclose(f);
    return data;
}

static int has_extension(VkPhysicalDevice pd, const char * name) {
    uint32_t n = 0;
    vkEnumerateDeviceExtensionProperties(pd, NULL, &n, NULL);
    VkExtensionProperties * e = calloc(n, sizeof(*e));
    vkEnumerateDeviceExtensionProperties(pd, NULL, &n, e);
    int found = 0;
    for (uint32_t i = 0; i < n && !found; ++i) {
        found = strcmp(e[i].extensionName, name) == 0;
    }
    free(e);
    return found;
}

// a device and what every pipeline on it shares
struct ctx {
    VkDevice                                              dev;
    VkDescriptorSetLayout                                 dsl;
    VkPipelineLayout                                      layout;
    PFN_vkGetPipelineExecutablePropertiesKHR              get_exec;
    PFN_vkGetPipelineExecutableStatisticsKHR              get_stats;
    PFN_vkGetPipelineExecutableInternalRepresentationsKHR get_reprs;
};

static void make_ctx(VkPhysicalDevice pd, const VkDeviceCreateInfo * dci, struct ctx * c) {
    VkResult r = vkCreateDevice(pd, dci, NULL, &c->dev);
    if (r != VK_SUCCESS) {
        die("vkCreateDevice", r);
    }
    c->get_exec =
        (PFN_vkGetPipelineExecutablePropertiesKHR) vkGetDeviceProcAddr(c->dev, "vkGetPipelineExecutablePropertiesKHR");
    c->get_stats =
        (PFN_vkGetPipelineExecutableStatisticsKHR) vkGetDeviceProcAddr(c->dev, "vkGetPipelineExecutableStatisticsKHR");
    c->get_reprs = (PFN_vkGetPipelineExecutableInternalRepresentationsKHR) vkGetDeviceProcAddr(
        c->dev, "vkGetPipelineExecutableInternalRepresentationsKHR");
    VkDescriptorSetLayoutBinding binds[N_BINDINGS];
    for (uint32_t b = 0; b < N_BINDINGS; ++b) {
        binds[b] = (VkDescriptorSetLayoutBinding) { b, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1,
                                                    VK_SHADER_STAGE_COMPUTE_BIT, NULL };
    }
    VkDescriptorSetLayoutCreateInfo dslci = { VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, NULL, 0, N_BINDINGS,
                                              binds };

    r = vkCreateDescriptorSetLayout(c->dev, &dslci, NULL, &c->dsl);
    if (r != VK_SUCCESS) {
        die("vkCreateDescriptorSetLayout", r);
    }
    VkPushConstantRange        pcr  = { VK_SHADER_STAGE_COMPUTE_BIT, 0, 128 };
    VkPipelineLayoutCreateInfo plci = { VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, NULL, 0, 1, &c->dsl, 1, &pcr };

    r = vkCreatePipelineLayout(c->dev, &plci, NULL, &c->layout);
    if (r != VK_SUCCESS) {
        die("vkCreatePipelineLayout", r);
    }
}

int main(int argc, char ** argv) {
    if (argc < 2 || (strcmp(argv[1], "--device") != 0 && argc < 3)) {
        fprintf(stderr, "usage: %s --device | %s JOBS OUTDIR\n", argv[0], argv[0]);
        return 2;
    }
    VkApplicationInfo app = {
        VK_STRUCTURE_TYPE_APPLICATION_INFO, NULL, "vk_pipeline_stats", 1, NULL, 0, VK_API_VERSION_1_3
    };
    VkInstanceCreateInfo ici = { VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, NULL, 0, &app, 0, NULL, 0, NULL };
    VkInstance           inst;
    VkResult             r = vkCreateInstance(&ici, NULL, &inst);
    if (r != VK_SUCCESS) {
        die("vkCreateInstance", r);
    }
    uint32_t n_pd = 0;
    vkEnumeratePhysicalDevices(inst, &n_pd, NULL);
    if (n_pd == 0) {
        fprintf(stderr, "vk_pipeline_stats: no Vulkan device\n");
        return 1;
    }
    VkPhysicalDevice * pds = calloc(n_pd, sizeof(*pds));
    vkEnumeratePhysicalDevices(inst, &n_pd, pds);
    // the first device that can report pipeline executables (RADV's null device with RADV_FORCE_FAMILY)
    VkPhysicalDevice pd = VK_NULL_HANDLE;
    for (uint32_t i = 0; i < n_pd && pd == VK_NULL_HANDLE; ++i) {
        if (has_extension(pds[i], VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME)) {
            pd = pds[i];
        }
    }
    if (pd == VK_NULL_HANDLE) {
        fprintf(stderr, "vk_pipeline_stats: no device with %s\n", VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
        return 1;
    }
    VkPhysicalDeviceProperties base;
    vkGetPhysicalDeviceProperties(pd, &base);
    // integer dot products: an extension, core in Vulkan 1.3 (its structures are the same)
    const int has_idot =
        has_extension(pd, VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME) || base.apiVersion >= VK_API_VERSION_1_3;
    VkPhysicalDeviceShaderIntegerDotProductProperties idotp = {
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_PROPERTIES
    };
    VkPhysicalDeviceSubgroupSizeControlProperties sgc = {
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES, has_idot ? &idotp : NULL
    };
    VkPhysicalDeviceSubgroupProperties sg    = { VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES, &sgc };
    VkPhysicalDeviceProperties2        props = { VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, &sg };
    vkGetPhysicalDeviceProperties2(pd, &props);
    VkPhysicalDeviceShaderIntegerDotProductFeatures idotf = {
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES
    };
    VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR pexf = {
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR, has_idot ? &idotf : NULL, VK_TRUE
    };
    VkPhysicalDeviceVulkan12Features f12 = { VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, &pexf };
    VkPhysicalDeviceVulkan11Features f11 = { VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES, &f12 };
    VkPhysicalDeviceFeatures2        f2  = { VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &f11 };
    vkGetPhysicalDeviceFeatures2(pd, &f2); // every feature the device has (16-bit storage, int8, int dot, ...)
    if (strcmp(argv[1], "--device") == 0) {
        printf("{\"name\": ");
        json_string(stdout, props.properties.deviceName);
        printf(", \"vendor_id\": %u, \"api_version\": \"%u.%u\", \"subgroup_size\": %u, \"min_subgroup_size\": %u, "
               "\"max_subgroup_size\": %u, \"subgroup_arithmetic\": %d, \"max_shared_memory\": %u, "
               "\"integer_dot_product\": %d, \"int8_dot_accelerated\": %d}\n",
               props.properties.vendorID, VK_API_VERSION_MAJOR(base.apiVersion), VK_API_VERSION_MINOR(base.apiVersion),
               sg.subgroupSize, sgc.minSubgroupSize, sgc.maxSubgroupSize,
               (sg.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) != 0,
               props.properties.limits.maxComputeSharedMemorySize, has_idot && idotf.shaderIntegerDotProduct,
               has_idot && idotp.integerDotProduct4x8BitPackedSignedAccelerated);
        return 0;
    }

    // a queue family with compute (the device is never used to run anything)
    uint32_t n_qf = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &n_qf, NULL);
    VkQueueFamilyProperties * qf = calloc(n_qf, sizeof(*qf));
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &n_qf, qf);
    uint32_t qfi = 0;
    while (qfi < n_qf && !(qf[qfi].queueFlags & VK_QUEUE_COMPUTE_BIT)) {
        ++qfi;
    }
    float                   prio = 1.0f;
    VkDeviceQueueCreateInfo qci  = { VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, NULL, 0, qfi, 1, &prio };
    pexf.pipelineExecutableInfo  = VK_TRUE;
    const char * exts[4];
    uint32_t     n_ext = 0;
    exts[n_ext++]      = VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME;
    if (has_extension(pd, VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME)) {
        exts[n_ext++] = VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME;
    }
    if (has_extension(pd, VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME)) {
        exts[n_ext++] = VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME;
    }
    // Two devices, made when first needed: ggml-vulkan creates its mat-vec pipelines without robust buffer
    // access (VK_EXT_pipeline_robustness) and its matrix multiplies with it (the device's robustBufferAccess);
    // a job naming "robust" gets the latter.
    const VkBool32 robust_supported = f2.features.robustBufferAccess;
    struct ctx     ctxs[2]          = { { VK_NULL_HANDLE }, { VK_NULL_HANDLE } };

    FILE * jobs = fopen(argv[1], "r");
    if (!jobs) {
        fprintf(stderr, "vk_pipeline_stats: cannot open %s\n", argv[1]);
        return 1;
    }
    char line[4096];
    while (fgets(line, sizeof line, jobs)) {
        char * save = NULL;
        char * name = strtok_r(line, " \t\n", &save);
        char * spv  = strtok_r(NULL, " \t\n", &save);
        char * sgs  = strtok_r(NULL, " \t\n", &save);
        if (!name || !spv || !sgs) {
            continue;
        }
        VkSpecializationMapEntry entries[MAX_SPEC];
        uint32_t                 values[MAX_SPEC];
        uint32_t                 n_spec = 0;
        int                      robust = 0;
        for (char * tok; (tok = strtok_r(NULL, " \t\n", &save)) && n_spec < MAX_SPEC;) {
            if (strcmp(tok, "robust") == 0) {
                robust = 1;
                continue;
            }
            unsigned id = 0, value = 0;
            sscanf(tok, "%u=%u", &id, &value);
            entries[n_spec] = (VkSpecializationMapEntry) { id, n_spec * 4, 4 };
            values[n_spec]  = value;
            ++n_spec;
        }
        struct ctx * c = &ctxs[robust];
        if (c->dev == VK_NULL_HANDLE) {
            f2.features.robustBufferAccess = robust ? robust_supported : VK_FALSE;
            VkDeviceCreateInfo dci         = {
                VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, &f2, 0, 1, &qci, 0, NULL, n_ext, exts, NULL
            };
            make_ctx(pd, &dci, c);
        }
        VkDevice                 dev = c->dev;
        size_t                   code_size;
        void *                   code = read_file(spv, &code_size);
        VkShaderModuleCreateInfo smci = { VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, NULL, 0, code_size, code };
        VkShaderModule           module;
        r = vkCreateShaderModule(dev, &smci, NULL, &module);
        if (r != VK_SUCCESS) {
            die("vkCreateShaderModule", r);
        }
        VkSpecializationInfo                                si  = { n_spec, entries, n_spec * 4, values };
        VkPipelineShaderStageRequiredSubgroupSizeCreateInfo rss = {
            VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO, NULL, (uint32_t) atoi(sgs)
        };
        VkPipelineShaderStageCreateInfo stage = { VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                                                  rss.requiredSubgroupSize ? &rss : NULL,
                                                  rss.requiredSubgroupSize ?
                                                      VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT :
                                                      0,
                                                  VK_SHADER_STAGE_COMPUTE_BIT,
                                                  module,
                                                  "main",
                                                  &si };
        VkComputePipelineCreateInfo     cpci  = { VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
                                                  NULL,
                                                  VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR |
                                                      VK_PIPELINE_CREATE_CAPTURE_INTERNAL_REPRESENTATIONS_BIT_KHR,
                                                  stage,
                                                  c->layout,
                                                  VK_NULL_HANDLE,
                                                  -1 };
        VkPipeline                      pipe;
        r = vkCreateComputePipelines(dev, VK_NULL_HANDLE, 1, &cpci, NULL, &pipe);
        if (r != VK_SUCCESS) {
            die("vkCreateComputePipelines", r);
        }

        char path[4096];
        snprintf(path, sizeof path, "%s/%s.json", argv[2], name);
        FILE * out = fopen(path, "w");
        if (!out) {
            fprintf(stderr, "vk_pipeline_stats: cannot write %s\n", path);
            return 1;
        }
        VkPipelineInfoKHR pinfo  = { VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR, NULL, pipe };
        uint32_t          n_exec = 0;
        c->get_exec(dev, &pinfo, &n_exec, NULL);
        VkPipelineExecutablePropertiesKHR * ep = calloc(n_exec, sizeof(*ep));
        for (uint32_t e = 0; e < n_exec; ++e) {
            ep[e].sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR;
        }
        c->get_exec(dev, &pinfo, &n_exec, ep);
        fprintf(out, "{\"executables\": [");
        for (uint32_t e = 0; e < n_exec; ++e) {
            fprintf(out, "%s{\"name\": ", e ? ", " : "");
            json_string(out, ep[e].name);
            fprintf(out, ", \"subgroup_size\": %u, \"statistics\": {", ep[e].subgroupSize);
            VkPipelineExecutableInfoKHR einfo = { VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR, NULL, pipe, e };
            uint32_t                    n_st  = 0;
            c->get_stats(dev, &einfo, &n_st, NULL);
            VkPipelineExecutableStatisticKHR * st = calloc(n_st, sizeof(*st));
            for (uint32_t s = 0; s < n_st; ++s) {
                st[s].sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR;
            }
            c->get_stats(dev, &einfo, &n_st, st);
            for (uint32_t s = 0; s < n_st; ++s) {
                fprintf(out, "%s", s ? ", " : "");
                json_string(out, st[s].name);
                switch (st[s].format) {
                    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR:
                        fprintf(out, ": %d", (int) st[s].value.b32);
                        break;
                    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR:
                        fprintf(out, ": %lld", (long long) st[s].value.i64);
                        break;
                    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR:
                        fprintf(out, ": %llu", (unsigned long long) st[s].value.u64);
                        break;
                    default:
                        fprintf(out, ": %g", st[s].value.f64);
                }
            }
            free(st);
            fprintf(out, "}, \"representations\": [");
            uint32_t n_ir = 0;
            c->get_reprs(dev, &einfo, &n_ir, NULL);
            VkPipelineExecutableInternalRepresentationKHR * ir = calloc(n_ir, sizeof(*ir));
            for (uint32_t i = 0; i < n_ir; ++i) {
                ir[i].sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INTERNAL_REPRESENTATION_KHR;
            }
            c->get_reprs(dev, &einfo, &n_ir, ir);
            for (uint32_t i = 0; i < n_ir; ++i) {
                ir[i].pData = calloc(1, ir[i].dataSize + 1);
            }
            c->get_reprs(dev, &einfo, &n_ir, ir);
            for (uint32_t i = 0; i < n_ir; ++i) {
                // the text goes to its own file, named by the representation ("Assembly" -> NAME.Assembly.txt)
                char rname[VK_MAX_DESCRIPTION_SIZE];
                snprintf(rname, sizeof rname, "%s", ir[i].name);
                for (char * c = rname; *c; ++c) {
                    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9'))) {
                        *c = '_';
                    }
                }
                snprintf(path, sizeof path, "%s/%s.%s.txt", argv[2], name, rname);
                FILE * t = fopen(path, "w");
                if (t) {
                    fputs((const char *) ir[i].pData, t);
                    fclose(t);
                }
                fprintf(out, "%s", i ? ", " : "");
                json_string(out, rname);
                free(ir[i].pData);
            }
            free(ir);
            fprintf(out, "]}");
        }
        fprintf(out, "]}\n");
        fclose(out);
        free(ep);
        vkDestroyPipeline(dev, pipe, NULL);
        vkDestroyShaderModule(dev, module, NULL);
        free(code);
    }
    fclose(jobs);
    for (int i = 0; i < 2; ++i) {
        if (ctxs[i].dev != VK_NULL_HANDLE) {
            vkDestroyPipelineLayout(ctxs[i].dev, ctxs[i].layout, NULL);
            vkDestroyDescriptorSetLayout(ctxs[i].dev, ctxs[i].dsl, NULL);
            vkDestroyDevice(ctxs[i].dev, NULL);
        }
    }
    vkDestroyInstance(inst, NULL);
    return 0;
}
